//! Turns the runtime's three method strings into the C#-like name .NET developers read.
//!
//! The runtime builds them in `MethodDesc::GetMethodInfo` (method.cpp):
//! - `MethodNamespace` = `TypeString::AppendType(FormatNamespace)`: ``Ns.Outer`1+Inner[Ns.Arg,...]``,
//!   nested types joined with `+`, instantiation in square brackets without assembly names, reserved
//!   characters (`,[]&*+\`) escaped with `\`; `dynamicClass` for LCG methods and IL stubs.
//! - `MethodName` = the metadata name (no method instantiation).
//! - `MethodSignature` = `PrettyPrintSigInternalLegacy(sig, name = " ")` (prettyprintsig.cpp):
//!   `[instance ][generic ][callconv ]RET  (ARG,ARG)` in IL-like type names (`int32`, `wchar`,
//!   `class System.String`, ``value class System.ReadOnlySpan`1<wchar>``, `!0` class type
//!   parameter, `!!0` method type parameter, `&` byref, `pMT: 00007F..` internal type handle).
//!
//! Output format (documented in the crate root): the declaring type fully qualified with `.` for
//! nesting and `<..>` generic arguments (C# keywords for primitive types), then `.Method`, then the
//! parameter types with namespaces dropped, e.g.
//! `System.Collections.Generic.Dictionary<string, int>.TryGetValue(string, ref int)`.
//! Class type parameters (`!0`) are replaced by the declaring type's arguments; method type
//! parameters stay `!!0` because the runtime does not report the method instantiation. Anything
//! that does not parse falls back to the raw text, PerfView style (`Namespace.Name(raw args)`).

/// Deepest nesting accepted before giving up on a string (hostile input must not overflow the stack).
const MAX_DEPTH: usize = 32;

/// C# keywords for the primitive types as `TypeString` spells them (full names).
fn keyword_for_full_name(name: &str) -> Option<&'static str> {
    Some(match name {
        "System.Void" => "void",
        "System.Boolean" => "bool",
        "System.Char" => "char",
        "System.SByte" => "sbyte",
        "System.Byte" => "byte",
        "System.Int16" => "short",
        "System.UInt16" => "ushort",
        "System.Int32" => "int",
        "System.UInt32" => "uint",
        "System.Int64" => "long",
        "System.UInt64" => "ulong",
        "System.Single" => "float",
        "System.Double" => "double",
        "System.Decimal" => "decimal",
        "System.IntPtr" => "nint",
        "System.UIntPtr" => "nuint",
        "System.Object" => "object",
        "System.String" => "string",
        _ => return None,
    })
}

/// Builds the display name. `namespace` may be empty (JIT helpers), then only the name shows.
pub(crate) fn display_name(namespace: &str, name: &str, signature: &str) -> String {
    let declaring = if namespace.is_empty() {
        None
    } else {
        TypeNameParser::new(namespace).parse_whole()
    };
    let mut out = String::with_capacity(namespace.len() + name.len() + signature.len());
    match &declaring {
        Some(ty) => render_type_name(ty, Mode::Full, false, &mut out),
        None => out.push_str(namespace),
    }
    if !out.is_empty() && !name.is_empty() {
        out.push('.');
    }
    out.push_str(name);
    if signature.is_empty() {
        return out;
    }
    let class_args = declaring.as_ref().map(|t| t.args.as_slice()).unwrap_or(&[]);
    match SigParser::new(signature).parse_method() {
        Some(sig) => {
            out.push('(');
            for (i, arg) in sig.args.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                render_sig_type(arg, class_args, &mut out);
            }
            out.push(')');
        }
        None => {
            if let Some(paren) = signature.find('(') {
                out.push_str(&signature[paren..]);
            }
        }
    }
    out
}

/// Which form of a type name to print.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// With namespace: declaring types and their generic arguments.
    Full,
    /// Without the outermost namespace: parameter types.
    Short,
}

/// A parsed `TypeString` name: ``Ns.Outer`1+Inner[Args]`` plus array/pointer suffixes.
#[derive(Debug, PartialEq, Eq)]
struct TypeName {
    /// `+`-separated segments, unescaped; the first carries the namespace.
    segments: Vec<String>,
    /// The whole instantiation, outer types' arguments first (as the runtime prints it).
    args: Vec<TypeName>,
    /// `[]`, `[,]`, `[*]`, `*`, `&` in order.
    suffix: String,
}

struct TypeNameParser<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> TypeNameParser<'a> {
    fn new(text: &'a str) -> Self {
        Self { text, pos: 0 }
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn parse_whole(mut self) -> Option<TypeName> {
        let ty = self.parse(0)?;
        (self.pos == self.text.len()).then_some(ty)
    }

    fn parse(&mut self, depth: usize) -> Option<TypeName> {
        if depth > MAX_DEPTH {
            return None;
        }
        let mut segments = vec![self.segment()?];
        while self.peek() == Some(b'+') {
            self.pos += 1;
            segments.push(self.segment()?);
        }
        let mut ty = TypeName {
            segments,
            args: Vec::new(),
            suffix: String::new(),
        };
        loop {
            match self.peek() {
                Some(b'*') => {
                    self.pos += 1;
                    ty.suffix.push('*');
                }
                Some(b'&') => {
                    self.pos += 1;
                    ty.suffix.push('&');
                }
                Some(b'[') => {
                    let rest = &self.text.as_bytes()[self.pos + 1..];
                    match rest.first() {
                        Some(b']') => {
                            self.pos += 2;
                            ty.suffix.push_str("[]");
                        }
                        Some(b'*') if rest.get(1) == Some(&b']') => {
                            self.pos += 3;
                            ty.suffix.push_str("[*]");
                        }
                        Some(b',') => {
                            let commas = rest.iter().take_while(|&&b| b == b',').count();
                            if rest.get(commas) != Some(&b']') {
                                return None;
                            }
                            self.pos += commas + 2;
                            ty.suffix.push('[');
                            ty.suffix.extend(std::iter::repeat_n(',', commas));
                            ty.suffix.push(']');
                        }
                        _ if ty.args.is_empty() && ty.suffix.is_empty() => {
                            self.pos += 1;
                            ty.args = self.generic_args(depth)?;
                        }
                        _ => return None,
                    }
                }
                _ => return Some(ty),
            }
        }
    }

    /// After the opening `[`: `Arg,Arg]`, where an argument may itself be bracketed and
    /// assembly-qualified (`[Ns.T, Assembly, Version=...]`, as `FormatFullInst` would print).
    fn generic_args(&mut self, depth: usize) -> Option<Vec<TypeName>> {
        let mut args = Vec::new();
        loop {
            if self.peek() == Some(b'[') {
                self.pos += 1;
                args.push(self.parse(depth + 1)?);
                self.skip_assembly_qualifier()?;
            } else {
                args.push(self.parse(depth + 1)?);
            }
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Some(args);
                }
                _ => return None,
            }
        }
    }

    /// Skips `, Assembly, Version=...]` up to and including the closing bracket.
    fn skip_assembly_qualifier(&mut self) -> Option<()> {
        let bytes = self.text.as_bytes();
        while let Some(&b) = bytes.get(self.pos) {
            self.pos += 1;
            match b {
                b'\\' => self.pos += 1,
                b']' => return Some(()),
                _ => {}
            }
        }
        None
    }

    /// One segment up to an unescaped delimiter; backslash escapes are removed.
    fn segment(&mut self) -> Option<String> {
        let mut out = String::new();
        let mut chars = self.text[self.pos..].char_indices();
        while let Some((offset, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, escaped)) => out.push(escaped),
                    None => return None,
                },
                '+' | '[' | ']' | ',' | '*' | '&' => {
                    self.pos += offset;
                    return (!out.is_empty()).then_some(out);
                }
                _ => out.push(c),
            }
        }
        self.pos = self.text.len();
        (!out.is_empty()).then_some(out)
    }
}

/// Splits ``Name`3`` into (`Name`, 3); names without a valid arity take no arguments.
fn split_arity(segment: &str) -> (&str, usize) {
    if let Some(tick) = segment.rfind('`') {
        if let Ok(arity) = segment[tick + 1..].parse::<usize>() {
            return (&segment[..tick], arity);
        }
    }
    (segment, 0)
}

/// Drops the namespace: the text after the last `.` that is not inside a compiler-generated
/// `<...>` group (so `<Main>$` and `Ns.<>c` both come out right).
fn strip_namespace(name: &str) -> &str {
    let mut depth = 0usize;
    let mut cut = 0;
    for (i, b) in name.bytes().enumerate() {
        match b {
            b'<' => depth += 1,
            b'>' => depth = depth.saturating_sub(1),
            b'.' if depth == 0 => cut = i + 1,
            _ => {}
        }
    }
    if cut >= name.len() {
        name
    } else {
        &name[cut..]
    }
}

/// Renders a `TypeString` name. `alias` maps primitive types to C# keywords (only for generic
/// arguments: a declaring type stays `System.String`).
fn render_type_name(ty: &TypeName, mode: Mode, alias: bool, out: &mut String) {
    if alias && ty.segments.len() == 1 && ty.args.is_empty() {
        if let Some(keyword) = keyword_for_full_name(&ty.segments[0]) {
            out.push_str(keyword);
            out.push_str(&ty.suffix);
            return;
        }
    }
    let arities: Vec<usize> = ty.segments.iter().map(|s| split_arity(s).1).collect();
    // Distribute the instantiation over the segments by arity; if the counts disagree (odd input),
    // show all arguments on the innermost type rather than lose any.
    let total = arities.iter().fold(0usize, |sum, &a| sum.saturating_add(a));
    let distribute = total == ty.args.len();
    let mut next_arg = 0;
    for (i, segment) in ty.segments.iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        let (base, arity) = split_arity(segment);
        let base = if i == 0 && mode == Mode::Short {
            strip_namespace(base)
        } else {
            base
        };
        out.push_str(base);
        let take = if distribute {
            arity
        } else if i + 1 == ty.segments.len() {
            ty.args.len()
        } else {
            0
        };
        if take > 0 {
            out.push('<');
            for (j, arg) in ty.args[next_arg..next_arg + take].iter().enumerate() {
                if j > 0 {
                    out.push_str(", ");
                }
                render_type_name(arg, mode, true, out);
            }
            out.push('>');
            next_arg += take;
        }
    }
    out.push_str(&ty.suffix);
}

/// A parsed legacy signature type.
#[derive(Debug, PartialEq, Eq)]
enum SigType {
    /// A primitive, already as its C# keyword.
    Primitive(&'static str),
    /// `class X` / `value class X`, with a generic instantiation if `X<...>` followed.
    Named { name: String, args: Vec<SigType> },
    /// `!N`: the declaring type's N-th generic argument.
    ClassVar(u32),
    /// `!!N`: the method's N-th generic argument.
    MethodVar(u32),
    /// `T[]` (rank 1) or `T[,]`.
    Array(Box<SigType>, usize),
    /// `T*`.
    Pointer(Box<SigType>),
    /// `T&`; `readonly_in` when the byref carries `modreq(InAttribute)` (C# `in`).
    ByRef(Box<SigType>, bool),
    /// `fnptr RET (ARGS)`.
    FnPtr {
        unmanaged: bool,
        ret: Box<SigType>,
        args: Vec<SigType>,
    },
    /// `pMT: <hex>`: an internal type handle (IL stubs).
    TypeHandle,
    /// `...`: the vararg sentinel.
    VarArgs,
    /// Text kept verbatim (`[module#.., token#..]`).
    Verbatim(String),
}

/// A parsed method signature; the return type is parsed (to find the argument list) but not shown.
struct MethodSig {
    args: Vec<SigType>,
}

struct SigParser<'a> {
    text: &'a str,
    pos: usize,
}

/// Primitive spellings from `PrettyPrintTypeA`, longest first so `int32` wins over `int`.
const PRIMITIVES: &[(&str, &str)] = &[
    ("unsigned int8", "byte"),
    ("unsigned int16", "ushort"),
    ("unsigned int32", "uint"),
    ("unsigned int64", "ulong"),
    ("unsigned int", "nuint"),
    ("int8", "sbyte"),
    ("int16", "short"),
    ("int32", "int"),
    ("int64", "long"),
    ("int", "nint"),
    ("float32", "float"),
    ("float64", "double"),
    ("void", "void"),
    ("bool", "bool"),
    ("wchar", "char"),
    ("refany", "TypedReference"),
];

/// Calling-convention words `PrettyPrintSigWorkerInternal` may print before the return type.
const PREFIXES: &[&str] = &[
    "instance ",
    "generic ",
    "explicit ",
    "unmanaged cdecl ",
    "unmanaged stdcall ",
    "unmanaged thiscall ",
    "unmanaged fastcall ",
    "native vararg ",
    "vararg ",
    "<error> ",
];

impl<'a> SigParser<'a> {
    fn new(text: &'a str) -> Self {
        Self { text, pos: 0 }
    }

    fn rest(&self) -> &'a str {
        &self.text[self.pos..]
    }

    fn eat(&mut self, token: &str) -> bool {
        if self.rest().starts_with(token) {
            self.pos += token.len();
            true
        } else {
            false
        }
    }

    fn skip_spaces(&mut self) {
        while self.rest().starts_with(' ') {
            self.pos += 1;
        }
    }

    fn parse_method(mut self) -> Option<MethodSig> {
        let (_, _, args) = self.parse_sig_body(0)?;
        (self.pos == self.text.len()).then_some(MethodSig { args })
    }

    /// `[prefixes] RET [spaces] ( ARGS )`, shared by method signatures and `fnptr`.
    fn parse_sig_body(&mut self, depth: usize) -> Option<(bool, SigType, Vec<SigType>)> {
        let mut unmanaged = false;
        while let Some(prefix) = PREFIXES.iter().find(|p| self.rest().starts_with(**p)) {
            unmanaged |= prefix.starts_with("unmanaged");
            self.pos += prefix.len();
        }
        let ret = self.parse_type(depth)?;
        self.skip_spaces();
        if !self.eat("(") {
            return None;
        }
        let mut args = Vec::new();
        if self.eat(")") {
            return Some((unmanaged, ret, args));
        }
        loop {
            if self.eat("...") {
                args.push(SigType::VarArgs);
            } else {
                args.push(self.parse_type(depth)?);
            }
            if self.eat(",") {
                continue;
            }
            if self.eat(")") {
                return Some((unmanaged, ret, args));
            }
            return None;
        }
    }

    fn parse_type(&mut self, depth: usize) -> Option<SigType> {
        if depth > MAX_DEPTH {
            return None;
        }
        let mut ty = self.parse_base(depth)?;
        loop {
            let rest = self.rest();
            if rest.starts_with('<')
                && matches!(&ty, SigType::Named { args, .. } if args.is_empty())
            {
                self.pos += 1;
                let mut parsed = Vec::new();
                loop {
                    parsed.push(self.parse_type(depth + 1)?);
                    if self.eat(",") {
                        continue;
                    }
                    if self.eat(">") {
                        break;
                    }
                    return None;
                }
                if let SigType::Named { args, .. } = &mut ty {
                    *args = parsed;
                }
            } else if rest.starts_with('[') {
                let close = rest.find(']')?;
                let inner = &rest[1..close];
                // `[]`, `[,]`, `[??]` (rank 0) or bounds like `[1...5,]`.
                if !inner
                    .bytes()
                    .all(|b| b == b',' || b == b'.' || b == b'?' || b.is_ascii_digit())
                {
                    return None;
                }
                let rank = inner.bytes().filter(|&b| b == b',').count() + 1;
                self.pos += close + 1;
                ty = SigType::Array(Box::new(ty), rank);
            } else if self.eat("*") {
                ty = SigType::Pointer(Box::new(ty));
            } else if self.eat("&") {
                ty = SigType::ByRef(Box::new(ty), false);
            } else if self.eat(" pinned") {
                // Only in local signatures; nothing to show.
            } else {
                return Some(ty);
            }
        }
    }

    fn parse_base(&mut self, depth: usize) -> Option<SigType> {
        for modifier in ["required_modifier ", "optional_modifier "] {
            if self.eat(modifier) {
                let class = self.class_name()?;
                if !self.eat(" ") {
                    return None;
                }
                let inner = self.parse_type(depth + 1)?;
                let is_in = modifier.starts_with("required")
                    && class == "System.Runtime.InteropServices.InAttribute";
                return Some(match inner {
                    SigType::ByRef(target, _) if is_in => SigType::ByRef(target, true),
                    other => other,
                });
            }
        }
        if self.eat("value class ") || self.eat("class ") {
            let name = self.class_name()?;
            return Some(SigType::Named {
                name,
                args: Vec::new(),
            });
        }
        if self.eat("!!") {
            return self.number().map(SigType::MethodVar);
        }
        if self.eat("!") {
            return self.number().map(SigType::ClassVar);
        }
        if self.eat("fnptr ") {
            let (unmanaged, ret, args) = self.parse_sig_body(depth + 1)?;
            return Some(SigType::FnPtr {
                unmanaged,
                ret: Box::new(ret),
                args,
            });
        }
        if self.eat("native ") {
            return self.parse_type(depth + 1);
        }
        if self.eat("pMT: ") {
            let digits = self
                .rest()
                .bytes()
                .take_while(u8::is_ascii_hexdigit)
                .count();
            if digits == 0 {
                return None;
            }
            self.pos += digits;
            return Some(SigType::TypeHandle);
        }
        if self.rest().starts_with("[module#") {
            let close = self.rest().find(']')?;
            let text = self.rest()[..=close].to_string();
            self.pos += close + 1;
            return Some(SigType::Verbatim(text));
        }
        let rest = self.rest();
        for &(spelling, keyword) in PRIMITIVES {
            if let Some(after) = rest.strip_prefix(spelling) {
                if after.is_empty() || after.starts_with([',', '(', ')', '>', '[', '*', '&', ' ']) {
                    self.pos += spelling.len();
                    return Some(SigType::Primitive(keyword));
                }
            }
        }
        None
    }

    fn number(&mut self) -> Option<u32> {
        let digits = self.rest().bytes().take_while(u8::is_ascii_digit).count();
        let value = self.rest()[..digits].parse().ok()?;
        self.pos += digits;
        Some(value)
    }

    /// A class name as `PrettyPrintClass` prints it: `Ns.Name` or a nested type's bare name. A `<`
    /// at the start of an identifier opens a compiler-generated name (`<Main>d__0`, `<>c`), anywhere
    /// else it opens a generic instantiation.
    fn class_name(&mut self) -> Option<String> {
        let bytes = self.text.as_bytes();
        let start = self.pos;
        let mut at_identifier_start = true;
        while let Some(&b) = bytes.get(self.pos) {
            match b {
                b'<' if at_identifier_start => {
                    let mut depth = 0usize;
                    loop {
                        match bytes.get(self.pos) {
                            Some(b'<') => depth += 1,
                            Some(b'>') => {
                                depth = depth.saturating_sub(1);
                                if depth == 0 {
                                    self.pos += 1;
                                    break;
                                }
                            }
                            Some(_) => {}
                            None => return None,
                        }
                        self.pos += 1;
                    }
                    at_identifier_start = false;
                }
                b',' | b'(' | b')' | b'<' | b'>' | b'[' | b']' | b'*' | b'&' | b' ' => break,
                b'.' | b'/' => {
                    at_identifier_start = true;
                    self.pos += 1;
                }
                _ => {
                    at_identifier_start = false;
                    self.pos += 1;
                }
            }
        }
        (self.pos > start).then(|| self.text[start..self.pos].to_string())
    }
}

/// Renders a parameter type in short form; `class_args` substitutes `!N`.
fn render_sig_type(ty: &SigType, class_args: &[TypeName], out: &mut String) {
    match ty {
        SigType::Primitive(keyword) => out.push_str(keyword),
        SigType::Named { name, args } => {
            if args.is_empty() {
                if let Some(keyword) = keyword_for_full_name(name) {
                    out.push_str(keyword);
                    return;
                }
            }
            let (base, _) = split_arity(strip_namespace(name));
            out.push_str(base);
            if !args.is_empty() {
                out.push('<');
                for (i, arg) in args.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    render_sig_type(arg, class_args, out);
                }
                out.push('>');
            }
        }
        SigType::ClassVar(index) => match class_args.get(*index as usize) {
            Some(arg) => render_type_name(arg, Mode::Short, true, out),
            None => {
                out.push('!');
                out.push_str(&index.to_string());
            }
        },
        SigType::MethodVar(index) => {
            out.push_str("!!");
            out.push_str(&index.to_string());
        }
        SigType::Array(element, rank) => {
            render_sig_type(element, class_args, out);
            out.push('[');
            out.extend(std::iter::repeat_n(',', rank.saturating_sub(1)));
            out.push(']');
        }
        SigType::Pointer(target) => {
            render_sig_type(target, class_args, out);
            out.push('*');
        }
        SigType::ByRef(target, readonly_in) => {
            out.push_str(if *readonly_in { "in " } else { "ref " });
            render_sig_type(target, class_args, out);
        }
        SigType::FnPtr {
            unmanaged,
            ret,
            args,
        } => {
            out.push_str(if *unmanaged {
                "delegate* unmanaged<"
            } else {
                "delegate*<"
            });
            for arg in args {
                render_sig_type(arg, class_args, out);
                out.push_str(", ");
            }
            render_sig_type(ret, class_args, out);
            out.push('>');
        }
        SigType::TypeHandle => out.push_str("pMT"),
        SigType::VarArgs => out.push_str("__arglist"),
        SigType::Verbatim(text) => out.push_str(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(ns: &str, method: &str, sig: &str) -> String {
        display_name(ns, method, sig)
    }

    // Strings below are as the runtime emits them; the ones marked "seen" appear verbatim in
    // PerfView's test baselines of real .NET traces.

    #[test]
    fn plain_static_method() {
        // seen
        assert_eq!(
            name("System.Diagnostics.Tracing.EventPipe", ".cctor", "void  ()"),
            "System.Diagnostics.Tracing.EventPipe..cctor()"
        );
    }

    #[test]
    fn pointers_and_byrefs() {
        // seen
        assert_eq!(
            name(
                "System.Text.Unicode.Utf16Utility",
                "GetPointerToFirstInvalidChar",
                "wchar*  (wchar*,int32,int64&,int32&)"
            ),
            "System.Text.Unicode.Utf16Utility.GetPointerToFirstInvalidChar(char*, int, ref long, ref int)"
        );
    }

    #[test]
    fn generic_method_keeps_method_type_parameters() {
        // seen
        assert_eq!(
            name(
                "System.Runtime.CompilerServices.AsyncTaskMethodBuilder",
                "Start",
                "instance generic void  (!!0&)"
            ),
            "System.Runtime.CompilerServices.AsyncTaskMethodBuilder.Start(ref !!0)"
        );
    }

    #[test]
    fn il_stub_with_type_handle() {
        // seen
        assert_eq!(
            name(
                "dynamicClass",
                "IL_STUB_InstantiatingStub",
                "void  (pMT: 00007FF7E3643CA8)"
            ),
            "dynamicClass.IL_STUB_InstantiatingStub(pMT)"
        );
    }

    #[test]
    fn class_type_parameters_are_substituted() {
        assert_eq!(
            name(
                "System.Collections.Generic.List`1[System.Int32]",
                "Add",
                "instance void  (!0)"
            ),
            "System.Collections.Generic.List<int>.Add(int)"
        );
        assert_eq!(
            name(
                "System.Collections.Generic.Dictionary`2[System.__Canon,System.Int32]",
                "TryGetValue",
                "instance bool  (!0,!1&)"
            ),
            "System.Collections.Generic.Dictionary<System.__Canon, int>.TryGetValue(__Canon, ref int)"
        );
    }

    #[test]
    fn nested_generic_types_distribute_arguments() {
        assert_eq!(
            name(
                "System.Collections.Generic.Dictionary`2+Enumerator[System.String,System.Collections.Generic.List`1[System.Int32]]",
                "MoveNext",
                "instance bool  ()"
            ),
            "System.Collections.Generic.Dictionary<string, System.Collections.Generic.List<int>>.Enumerator.MoveNext()"
        );
    }

    #[test]
    fn async_state_machine_and_lambdas() {
        assert_eq!(
            name("MyApp.Program+<Main>d__0", "MoveNext", "instance void  ()"),
            "MyApp.Program.<Main>d__0.MoveNext()"
        );
        assert_eq!(
            name(
                "MyApp.Program+<>c",
                "<Main>b__0_0",
                "instance bool  (class MyApp.Order)"
            ),
            "MyApp.Program.<>c.<Main>b__0_0(Order)"
        );
        assert_eq!(
            name("Program", "<<Main>$>g__Fib|0_0", "int32  (int32)"),
            "Program.<<Main>$>g__Fib|0_0(int)"
        );
    }

    #[test]
    fn generic_instantiations_in_parameters() {
        assert_eq!(
            name(
                "System.Linq.Enumerable",
                "Where",
                "generic class System.Collections.Generic.IEnumerable`1<!!0>  (class System.Collections.Generic.IEnumerable`1<!!0>,class System.Func`2<!!0,bool>)"
            ),
            "System.Linq.Enumerable.Where(IEnumerable<!!0>, Func<!!0, bool>)"
        );
        assert_eq!(
            name(
                "System.String",
                "Concat",
                "class System.String  (value class System.ReadOnlySpan`1<wchar>,value class System.ReadOnlySpan`1<wchar>)"
            ),
            "System.String.Concat(ReadOnlySpan<char>, ReadOnlySpan<char>)"
        );
    }

    #[test]
    fn compiler_generated_type_in_signature() {
        assert_eq!(
            name(
                "System.Runtime.CompilerServices.AsyncMethodBuilderCore",
                "Start",
                "generic void  (value class <Main>d__0&)"
            ),
            "System.Runtime.CompilerServices.AsyncMethodBuilderCore.Start(ref <Main>d__0)"
        );
        assert_eq!(
            name("C", "M", "void  (class <>c__DisplayClass0_0`1<!!0>)"),
            "C.M(<>c__DisplayClass0_0<!!0>)"
        );
    }

    #[test]
    fn arrays_objects_and_keywords() {
        assert_eq!(
            name("MyApp.Program", "Main", "void  (class System.String[])"),
            "MyApp.Program.Main(string[])"
        );
        assert_eq!(
            name(
                "M",
                "F",
                "void  (int32[,],class System.Object,value class System.Decimal,unsigned int8*,int,unsigned int)"
            ),
            "M.F(int[,], object, decimal, byte*, nint, nuint)"
        );
    }

    #[test]
    fn in_parameters_and_modifiers() {
        assert_eq!(
            name(
                "System.DateTime",
                "op_Equality",
                "bool  (required_modifier System.Runtime.InteropServices.InAttribute value class System.DateTime&,value class System.DateTime)"
            ),
            "System.DateTime.op_Equality(in DateTime, DateTime)"
        );
        assert_eq!(
            name(
                "N",
                "V",
                "void  (optional_modifier System.Runtime.CompilerServices.IsConst int32)"
            ),
            "N.V(int)"
        );
    }

    #[test]
    fn function_pointers_and_varargs() {
        assert_eq!(
            name(
                "Interop",
                "Call",
                "void  (fnptr unmanaged cdecl int32(int32,wchar*),...)"
            ),
            "Interop.Call(delegate* unmanaged<int, char*, int>, __arglist)"
        );
    }

    #[test]
    fn jit_helper_has_only_a_name() {
        assert_eq!(name("", "JIT_MemSet", ""), "JIT_MemSet");
    }

    #[test]
    fn unparsable_signature_falls_back_to_raw_arguments() {
        assert_eq!(
            name("A.B", "C", "garbage (whatever, Invalid TypeRef record)"),
            "A.B.C(whatever, Invalid TypeRef record)"
        );
        assert_eq!(name("A.B", "C", "no parens at all"), "A.B.C");
    }

    #[test]
    fn unparsable_namespace_is_kept_verbatim() {
        assert_eq!(
            name("Broken[Name", "M", "instance void  (!0)"),
            "Broken[Name.M(!0)"
        );
    }

    #[test]
    fn escaped_characters_in_type_names() {
        assert_eq!(name("Odd\\+Name\\,X", "M", "void  ()"), "Odd+Name,X.M()");
    }

    #[test]
    fn assembly_qualified_arguments_are_tolerated() {
        assert_eq!(
            name(
                "System.Collections.Generic.List`1[[System.Int32, System.Private.CoreLib, Version=8.0.0.0]]",
                "Add",
                "instance void  (!0)"
            ),
            "System.Collections.Generic.List<int>.Add(int)"
        );
    }

    #[test]
    fn array_and_pointer_type_arguments() {
        assert_eq!(
            name(
                "System.Collections.Generic.List`1[System.Byte[]]",
                "Add",
                "instance void  (!0)"
            ),
            "System.Collections.Generic.List<byte[]>.Add(byte[])"
        );
        assert_eq!(
            name("G`1[System.Int32[,]]", "M", "void  (!0,!3)"),
            "G<int[,]>.M(int[,], !3)"
        );
    }

    #[test]
    fn hostile_inputs_never_panic() {
        let nasty = [
            "",
            "(",
            ")",
            "  (",
            "class ",
            "class <",
            "class <<<<",
            "value class X<",
            "!",
            "!!",
            "!99999999999999999999",
            "int32[",
            "fnptr fnptr fnptr",
            "pMT: ",
            "[module#",
            "\\",
            "`",
            "A`99999999999999999999999[B]",
            "A[B,[C",
            "A[",
            "ü\u{10FFFF}\\ü",
            "instance instance void  (int32,",
        ];
        for ns in nasty {
            for sig in nasty {
                let _ = name(ns, "M", sig);
            }
        }
        let deep_sig = format!("void  ({}int32{})", "class A<".repeat(500), ">".repeat(500));
        let _ = name("N", "M", &deep_sig);
        let deep_ns = format!("{}X{}", "A`1[".repeat(500), "]".repeat(500));
        let _ = name(&deep_ns, "M", "void  ()");
    }
}
