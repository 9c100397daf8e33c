//! Names for NativeAOT code from the executable's own symbol table.
//!
//! A NativeAOT process reports no method loads and no rundown: its managed code is compiled into
//! the executable, whose ELF symbol table (`.symtab`, kept unless the build strips it into a
//! `.dbg` file; `.dynsym` otherwise) names every method by the compiler's mangled name, e.g.
//! `S_P_CoreLib_System_Threading_Thread__StartCallback` or
//! `Storefront_Storefront_Catalog_CatalogEndpoints__Search`. [`demangle`] turns those into the
//! names .NET developers read (`System.Threading.Thread.StartCallback`), so that a frame in such
//! code gets a name like one a rundown would give it.

use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};

use crate::r2r::{ImageMethods, R2rError};

/// A symbol every NativeAOT executable defines (the managed entry point's wrapper): an ELF
/// without it is not one, and its symbols are not read.
const NATIVE_AOT_MARKER: &str = "__managed__Main";

/// Reads the named code of a NativeAOT executable's bytes, by RVA from the lowest mapped
/// address. Never panics; names are bounded by the file's size.
pub(crate) fn parse(bytes: &[u8]) -> Result<ImageMethods, R2rError> {
    let elf = object::File::parse(bytes).map_err(|_| R2rError::NotManaged("not an ELF file"))?;
    let mut symbols: Vec<_> = elf.symbols().collect();
    if symbols.is_empty() {
        symbols = elf.dynamic_symbols().collect();
    }
    if !symbols
        .iter()
        .any(|s| s.name_bytes() == Ok(NATIVE_AOT_MARKER.as_bytes()))
    {
        return Err(R2rError::NotManaged("an ELF file without NativeAOT code"));
    }
    let lowest = elf.segments().map(|s| s.address()).min().unwrap_or(0) & !0xfff;
    let mut named = Vec::new();
    let mut name_bytes = 0usize;
    for symbol in symbols {
        if symbol.kind() != SymbolKind::Text || symbol.size() == 0 {
            continue;
        }
        let Ok(raw) = symbol.name() else { continue };
        let begin = symbol.address().wrapping_sub(lowest);
        let (Ok(begin), Ok(end)) = (
            u32::try_from(begin),
            u32::try_from(begin.saturating_add(symbol.size())),
        ) else {
            continue;
        };
        let name = demangle(raw);
        name_bytes += name.len();
        if name_bytes > bytes.len() {
            return Err(R2rError::Malformed("symbol names larger than the image"));
        }
        named.push((begin, end, name.into_boxed_str()));
    }
    Ok(ImageMethods::from_spans(named))
}

/// The name .NET developers read for a NativeAOT method symbol: `Namespace.Type.Method`, nested
/// types joined with `.`, generic arguments in `<...>` (`List<System.__Canon>.Add`),
/// constructors `.ctor`. The compiler's mangling (`ILCompiler.NativeAotNameMangler`) writes
/// `<assembly>_<namespace>_<type>__<method>`, turning every character that is not a letter or a
/// digit into `_`, so it cannot be undone exactly: an underscore of the source becomes a `.`
/// here, and compiler-generated names (`<>c`, `<Main>b__0_0`) keep their underscores. The
/// assembly prefix is dropped (`S_P_CoreLib_` is `System.Private.CoreLib`; another assembly's
/// is dropped where the namespace repeats it, as `Storefront_Storefront_…` does). A symbol
/// that is not a managed method (the runtime's own C and C++ code) is returned as it is.
pub fn demangle(symbol: &str) -> String {
    match split_method(symbol) {
        Some((owner, method)) => {
            let owner = strip_assembly(owner);
            let mut out = type_name(owner);
            out.push('.');
            out.push_str(&method_name(method));
            out
        }
        None => symbol.to_string(),
    }
}

/// Splits at the separator of the owning type and the method: the first `__` outside `<...>`
/// between a letter, digit or `>` and a letter (`Thread__StartCallback`), so that runs of three or
/// more underscores (`___c`, a mangled `<>c`) and lambda suffixes (`b__0_0`) are not taken.
fn split_method(symbol: &str) -> Option<(&str, &str)> {
    let bytes = symbol.as_bytes();
    // Managed symbols start with their assembly's name; the runtime's own start otherwise
    // (`__managed__Main`, C++'s `_ZN…`).
    if !bytes.first()?.is_ascii_alphabetic() {
        return None;
    }
    let mut depth = 0usize;
    for i in 0..bytes.len().saturating_sub(2) {
        match bytes[i] {
            b'<' => depth += 1,
            b'>' => depth = depth.saturating_sub(1),
            b'_' if depth == 0
                && i > 0
                && bytes[i + 1] == b'_'
                && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'>')
                && (bytes[i + 2].is_ascii_alphabetic()
                    || bytes[i + 2] == b'_'
                        && i + 3 < bytes.len()
                        && bytes[i + 3].is_ascii_alphabetic()) =>
            {
                return Some((&symbol[..i], &symbol[i + 2..]));
            }
            _ => {}
        }
    }
    None
}

/// Drops the assembly's prefix: `S_P_<name>_` (`System.Private.<name>`), or the assembly name
/// before a namespace that starts like it, as most do (`StorefrontAot_Storefront_…`,
/// `System_Net_Http_System_Net_Http_…`, `Npgsql_Npgsql_…`). Kept where no namespace follows.
fn strip_assembly(owner: &str) -> &str {
    if let Some(rest) = owner.strip_prefix("S_P_") {
        return rest.split_once('_').map_or(rest, |(_, t)| t);
    }
    let plain = &owner[..owner.find('<').unwrap_or(owner.len())];
    let Some((first, _)) = plain.split_once('_') else {
        return owner;
    };
    for (at, _) in plain
        .match_indices('_')
        .filter(|&(at, _)| at >= first.len())
    {
        let rest = &owner[at + 1..];
        let next = rest.split(['_', '<']).next().unwrap_or_default();
        let related = !next.is_empty() && (first.starts_with(next) || next.starts_with(first));
        // The namespace must go on past its first part, to a type.
        if related && rest.len() > next.len() {
            return rest;
        }
    }
    owner
}

/// A mangled type as C#-like text: single underscores become `.`, the generic arity suffix
/// (`List_1`) is dropped before its arguments, which are named the same way.
fn type_name(mangled: &str) -> String {
    let (head, args) = match mangled.find('<') {
        Some(at) if mangled.ends_with('>') => {
            (&mangled[..at], Some(&mangled[at + 1..mangled.len() - 1]))
        }
        _ => (mangled, None),
    };
    let mut out = dots(match args {
        Some(_) => strip_arity(head),
        None => head,
    })
    // Shared generic code's placeholder type.
    .replace("System___Canon", "System.__Canon");
    if let Some(args) = args {
        push_args(&mut out, args);
    }
    out
}

/// `<A, B>` of an instantiation's mangled arguments.
fn push_args(out: &mut String, args: &str) {
    out.push('<');
    for (i, arg) in top_level_args(args).into_iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(&type_name(strip_assembly(arg)));
    }
    out.push('>');
}

/// `List_1` → `List`: the arity the mangler kept of `` List`1 ``.
fn strip_arity(head: &str) -> &str {
    match head.rsplit_once('_') {
        Some((name, arity)) if !arity.is_empty() && arity.bytes().all(|b| b.is_ascii_digit()) => {
            name
        }
        _ => head,
    }
}

/// Single underscores as `.`; runs of two or more kept (compiler-generated names).
fn dots(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    for (i, c) in text.char_indices() {
        let lone = c == '_'
            && i > 0
            && bytes.get(i - 1) != Some(&b'_')
            && bytes.get(i + 1).is_some_and(|&b| b != b'_');
        out.push(if lone { '.' } else { c });
    }
    out
}

/// The arguments of an instantiation, separated by `__` outside nested `<...>`.
fn top_level_args(args: &str) -> Vec<&str> {
    let bytes = args.as_bytes();
    let (mut parts, mut depth, mut start, mut i) = (Vec::new(), 0usize, 0usize, 0usize);
    while i < bytes.len() {
        match bytes[i] {
            b'<' => depth += 1,
            b'>' => depth = depth.saturating_sub(1),
            // `__` alone separates; a longer run is part of a name (`System___Canon`).
            b'_' if depth == 0
                && bytes.get(i + 1) == Some(&b'_')
                && i > start
                && bytes[i - 1] != b'_' =>
            {
                let next = bytes.get(i + 2).copied().unwrap_or(b'_');
                if next.is_ascii_alphabetic() {
                    parts.push(&args[start..i]);
                    start = i + 2;
                    i += 2;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    parts.push(&args[start..]);
    parts
}

/// A mangled method name: `_ctor` and `_cctor` are the constructors; a generic method's
/// arguments are named like a type's.
fn method_name(mangled: &str) -> String {
    match mangled {
        "_ctor" => ".ctor".to_string(),
        "_cctor" => ".cctor".to_string(),
        _ => match mangled.find('<') {
            Some(at) if mangled.ends_with('>') => {
                let mut out = mangled[..at].to_string();
                push_args(&mut out, &mangled[at + 1..mangled.len() - 1]);
                out
            }
            _ => mangled.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn managed_symbols_read_as_csharp_names() {
        for (symbol, name) in [
            (
                "S_P_CoreLib_System_Threading_Thread__StartCallback",
                "System.Threading.Thread.StartCallback",
            ),
            (
                "StorefrontAot_Storefront_Recommendations_RecommendationEngine__ScoreCandidates",
                "Storefront.Recommendations.RecommendationEngine.ScoreCandidates",
            ),
            (
                "Google_Protobuf_Google_Protobuf_ParsingPrimitives__ParseRawLittleEndian32",
                "Google.Protobuf.ParsingPrimitives.ParseRawLittleEndian32",
            ),
            (
                "S_P_CoreLib_System_Func_2<System___Canon__System_Security_Cryptography_System_Security_Cryptography_X509Certificates_PolicyData>__InvokeOpenInstanceThunk",
                "System.Func<System.__Canon, System.Security.Cryptography.X509Certificates.PolicyData>.InvokeOpenInstanceThunk",
            ),
            ("S_P_CoreLib_System_String___ctor", "System.String..ctor"),
            (
                "S_P_CoreLib_System_Collections_Generic_List_1<System___Canon>__Add",
                "System.Collections.Generic.List<System.__Canon>.Add",
            ),
            (
                "S_P_CoreLib_System_Collections_Generic_Dictionary_2<System___Canon__Int32>__FindValue",
                "System.Collections.Generic.Dictionary<System.__Canon, Int32>.FindValue",
            ),
            (
                "S_P_CoreLib_System_Array__Empty<S_P_CoreLib_System_Byte>",
                "System.Array.Empty<System.Byte>",
            ),
        ] {
            assert_eq!(demangle(symbol), name, "{symbol}");
        }
    }

    #[test]
    fn native_symbols_stay_as_they_are() {
        for symbol in [
            "RhpNewFast",
            "_ZN3WKS7gc_heap14garbage_collectEi",
            "memcpy",
            "__managed__Main",
        ] {
            assert_eq!(demangle(symbol), symbol);
        }
    }
}
