//! Just enough of ECMA-335 metadata (partition II, chapters 22–24) to name a `MethodDef` the way
//! the runtime's method events do: the declaring type as `TypeString` prints it (`Ns.Outer+Inner`),
//! the method name, and the signature as `PrettyPrintSigInternalLegacy` prints it
//! (`instance bool  (int32,class System.String)`), so [`crate::names`] renders both alike.

use std::collections::HashMap;

use super::pe::{read_u16, read_u32};
use super::R2rError;

/// Longest identifier, and longest rendered signature, accepted; longer ones are not names a
/// person reads, and the cap keeps a hostile image from multiplying a short blob into megabytes.
pub(super) const MAX_NAME_BYTES: usize = 2048;
/// Deepest type nesting followed in a signature or a chain of enclosing types.
const MAX_DEPTH: usize = 32;

const MODULE: usize = 0x00;
const TYPE_REF: usize = 0x01;
const TYPE_DEF: usize = 0x02;
const FIELD: usize = 0x04;
const METHOD_DEF: usize = 0x06;
const PARAM: usize = 0x08;
const INTERFACE_IMPL: usize = 0x09;
const MEMBER_REF: usize = 0x0a;
const DECL_SECURITY: usize = 0x0e;
const STAND_ALONE_SIG: usize = 0x11;
const EVENT: usize = 0x14;
const PROPERTY: usize = 0x17;
const MODULE_REF: usize = 0x1a;
const TYPE_SPEC: usize = 0x1b;
const ASSEMBLY: usize = 0x20;
const ASSEMBLY_REF: usize = 0x23;
const FILE: usize = 0x26;
const EXPORTED_TYPE: usize = 0x27;
const MANIFEST_RESOURCE: usize = 0x28;
const NESTED_CLASS: usize = 0x29;
const GENERIC_PARAM: usize = 0x2a;
const METHOD_SPEC: usize = 0x2b;
const GENERIC_PARAM_CONSTRAINT: usize = 0x2c;
const TABLES: usize = 0x2d;
/// Tag value of a coded index that no table uses.
const NONE: usize = usize::MAX;

/// A column of a metadata table (II.22).
#[derive(Clone, Copy)]
enum Column {
    U16,
    U32,
    String,
    Guid,
    Blob,
    /// A row of one table.
    Index(usize),
    /// A coded index (II.24.2.6): tables by tag, and the tag's width in bits.
    Coded(&'static [usize], u32),
}

const TYPE_DEF_OR_REF: Column = Column::Coded(&[TYPE_DEF, TYPE_REF, TYPE_SPEC], 2);
const RESOLUTION_SCOPE: Column = Column::Coded(&[MODULE, MODULE_REF, ASSEMBLY_REF, TYPE_REF], 2);
const HAS_CONSTANT: Column = Column::Coded(&[FIELD, PARAM, PROPERTY], 2);
const HAS_CUSTOM_ATTRIBUTE: Column = Column::Coded(
    &[
        METHOD_DEF,
        FIELD,
        TYPE_REF,
        TYPE_DEF,
        PARAM,
        INTERFACE_IMPL,
        MEMBER_REF,
        MODULE,
        DECL_SECURITY,
        PROPERTY,
        EVENT,
        STAND_ALONE_SIG,
        MODULE_REF,
        TYPE_SPEC,
        ASSEMBLY,
        ASSEMBLY_REF,
        FILE,
        EXPORTED_TYPE,
        MANIFEST_RESOURCE,
        GENERIC_PARAM,
        GENERIC_PARAM_CONSTRAINT,
        METHOD_SPEC,
    ],
    5,
);
const CUSTOM_ATTRIBUTE_TYPE: Column = Column::Coded(&[NONE, NONE, METHOD_DEF, MEMBER_REF, NONE], 3);
const HAS_FIELD_MARSHAL: Column = Column::Coded(&[FIELD, PARAM], 1);
const HAS_DECL_SECURITY: Column = Column::Coded(&[TYPE_DEF, METHOD_DEF, ASSEMBLY], 2);
const MEMBER_REF_PARENT: Column =
    Column::Coded(&[TYPE_DEF, TYPE_REF, MODULE_REF, METHOD_DEF, TYPE_SPEC], 3);
const HAS_SEMANTICS: Column = Column::Coded(&[EVENT, PROPERTY], 1);
const METHOD_DEF_OR_REF: Column = Column::Coded(&[METHOD_DEF, MEMBER_REF], 1);
const MEMBER_FORWARDED: Column = Column::Coded(&[FIELD, METHOD_DEF], 1);
const IMPLEMENTATION: Column = Column::Coded(&[FILE, ASSEMBLY_REF, EXPORTED_TYPE], 2);
const TYPE_OR_METHOD_DEF: Column = Column::Coded(&[TYPE_DEF, METHOD_DEF], 1);

use Column::{Blob, Guid, Index, String as Str, U16, U32};

/// The columns of tables 0x00..=0x2c, in table order (II.22.2–II.22.39).
const SCHEMA: [&[Column]; TABLES] = [
    &[U16, Str, Guid, Guid, Guid], // Module
    &[RESOLUTION_SCOPE, Str, Str], // TypeRef
    &[
        U32,
        Str,
        Str,
        TYPE_DEF_OR_REF,
        Index(FIELD),
        Index(METHOD_DEF),
    ], // TypeDef
    &[Index(FIELD)],               // FieldPtr
    &[U16, Str, Blob],             // Field
    &[Index(METHOD_DEF)],          // MethodPtr
    &[U32, U16, U16, Str, Blob, Index(PARAM)], // MethodDef
    &[Index(PARAM)],               // ParamPtr
    &[U16, U16, Str],              // Param
    &[Index(TYPE_DEF), TYPE_DEF_OR_REF], // InterfaceImpl
    &[MEMBER_REF_PARENT, Str, Blob], // MemberRef
    &[U16, HAS_CONSTANT, Blob],    // Constant
    &[HAS_CUSTOM_ATTRIBUTE, CUSTOM_ATTRIBUTE_TYPE, Blob], // CustomAttribute
    &[HAS_FIELD_MARSHAL, Blob],    // FieldMarshal
    &[U16, HAS_DECL_SECURITY, Blob], // DeclSecurity
    &[U16, U32, Index(TYPE_DEF)],  // ClassLayout
    &[U32, Index(FIELD)],          // FieldLayout
    &[Blob],                       // StandAloneSig
    &[Index(TYPE_DEF), Index(EVENT)], // EventMap
    &[Index(EVENT)],               // EventPtr
    &[U16, Str, TYPE_DEF_OR_REF],  // Event
    &[Index(TYPE_DEF), Index(PROPERTY)], // PropertyMap
    &[Index(PROPERTY)],            // PropertyPtr
    &[U16, Str, Blob],             // Property
    &[U16, Index(METHOD_DEF), HAS_SEMANTICS], // MethodSemantics
    &[Index(TYPE_DEF), METHOD_DEF_OR_REF, METHOD_DEF_OR_REF], // MethodImpl
    &[Str],                        // ModuleRef
    &[Blob],                       // TypeSpec
    &[U16, MEMBER_FORWARDED, Str, Index(MODULE_REF)], // ImplMap
    &[U32, Index(FIELD)],          // FieldRVA
    &[U32, U32],                   // EncLog
    &[U32],                        // EncMap
    &[U32, U16, U16, U16, U16, U32, Blob, Str, Str], // Assembly
    &[U32],                        // AssemblyProcessor
    &[U32, U32, U32],              // AssemblyOS
    &[U16, U16, U16, U16, U32, Blob, Str, Str, Blob], // AssemblyRef
    &[U32, Index(ASSEMBLY_REF)],   // AssemblyRefProcessor
    &[U32, U32, U32, Index(ASSEMBLY_REF)], // AssemblyRefOS
    &[U32, Str, Blob],             // File
    &[U32, U32, Str, Str, IMPLEMENTATION], // ExportedType
    &[U32, U32, Str, IMPLEMENTATION], // ManifestResource
    &[Index(TYPE_DEF), Index(TYPE_DEF)], // NestedClass
    &[U16, U16, TYPE_OR_METHOD_DEF, Str], // GenericParam
    &[METHOD_DEF_OR_REF, Blob],    // MethodSpec
    &[Index(GENERIC_PARAM), TYPE_DEF_OR_REF], // GenericParamConstraint
];

#[derive(Clone, Copy, Default)]
struct Table {
    rows: u32,
    /// Offset of the first row in the table stream.
    start: usize,
    row_size: usize,
}

/// The metadata of one module, read in place.
pub(super) struct Metadata<'a> {
    tables_stream: &'a [u8],
    strings: &'a [u8],
    blobs: &'a [u8],
    tables: [Table; TABLES],
    wide_strings: bool,
    wide_guids: bool,
    wide_blobs: bool,
    /// `TypeDef.MethodList` of every type, in row order: finds a method's declaring type.
    method_lists: Vec<u32>,
    /// Nested type row → enclosing type row.
    enclosing: HashMap<u32, u32>,
}

impl<'a> Metadata<'a> {
    /// Parses the metadata root (II.24.2.1) at the start of `bytes`.
    pub(super) fn parse(bytes: &'a [u8]) -> Result<Self, R2rError> {
        let malformed = R2rError::Malformed;
        if read_u32(bytes, 0) != Some(0x424a_5342) {
            return Err(malformed("no metadata signature"));
        }
        let version_length = read_u32(bytes, 12).ok_or(malformed("truncated metadata root"))?;
        let mut at = 16usize
            .checked_add(usize::try_from(version_length).map_err(|_| malformed("version"))?)
            .ok_or(malformed("metadata version length"))?;
        let stream_count = read_u16(bytes, at + 2).ok_or(malformed("truncated metadata root"))?;
        at += 4;
        let (mut tables_stream, mut strings, mut blobs) = (None, None, None);
        for _ in 0..stream_count {
            let offset = read_u32(bytes, at).ok_or(malformed("truncated stream header"))? as usize;
            let size =
                read_u32(bytes, at + 4).ok_or(malformed("truncated stream header"))? as usize;
            let name_start = at + 8;
            let name_len = bytes
                .get(name_start..)
                .and_then(|rest| rest.iter().take(32).position(|&b| b == 0))
                .ok_or(malformed("stream name"))?;
            let name = &bytes[name_start..name_start + name_len];
            let data = bytes
                .get(offset..offset.checked_add(size).ok_or(malformed("stream size"))?)
                .ok_or(malformed("stream outside the metadata"))?;
            match name {
                b"#~" => tables_stream = Some(data),
                b"#-" => return Err(R2rError::Unsupported("uncompressed metadata tables (#-)")),
                b"#Strings" => strings = Some(data),
                b"#Blob" => blobs = Some(data),
                _ => {}
            }
            at = name_start + (name_len + 4) / 4 * 4;
        }
        let tables_stream = tables_stream.ok_or(malformed("no #~ stream"))?;
        let heap_sizes = *tables_stream
            .get(6)
            .ok_or(malformed("truncated #~ header"))?;
        let valid = u64::from_le_bytes(
            tables_stream
                .get(8..16)
                .and_then(|b| b.try_into().ok())
                .ok_or(malformed("truncated #~ header"))?,
        );
        let mut tables = [Table::default(); TABLES];
        let mut at = 24usize;
        for bit in 0..64 {
            if valid & (1 << bit) == 0 {
                continue;
            }
            let rows = read_u32(tables_stream, at).ok_or(malformed("truncated row counts"))?;
            if let Some(table) = tables.get_mut(bit) {
                table.rows = rows;
            }
            at += 4;
        }
        let mut metadata = Self {
            tables_stream,
            strings: strings.unwrap_or(&[]),
            blobs: blobs.unwrap_or(&[]),
            tables,
            wide_strings: heap_sizes & 1 != 0,
            wide_guids: heap_sizes & 2 != 0,
            wide_blobs: heap_sizes & 4 != 0,
            method_lists: Vec::new(),
            enclosing: HashMap::new(),
        };
        for (table, columns) in SCHEMA.iter().enumerate() {
            let row_size: usize = columns.iter().map(|&c| metadata.width(c)).sum();
            let size = row_size
                .checked_mul(metadata.tables[table].rows as usize)
                .ok_or(malformed("table size"))?;
            metadata.tables[table].start = at;
            metadata.tables[table].row_size = row_size;
            at = at.checked_add(size).ok_or(malformed("table size"))?;
        }
        // Everything up to the last table read must be in the stream: then no cell read fails.
        if at > tables_stream.len() {
            return Err(malformed("tables run past the #~ stream"));
        }
        metadata.method_lists = (1..=metadata.tables[TYPE_DEF].rows)
            .map(|row| metadata.cell(TYPE_DEF, row, 5).unwrap_or(0))
            .collect();
        for row in 1..=metadata.tables[NESTED_CLASS].rows {
            if let (Some(nested), Some(outer)) = (
                metadata.cell(NESTED_CLASS, row, 0),
                metadata.cell(NESTED_CLASS, row, 1),
            ) {
                metadata.enclosing.insert(nested, outer);
            }
        }
        Ok(metadata)
    }

    pub(super) fn method_count(&self) -> u32 {
        self.tables[METHOD_DEF].rows
    }

    fn width(&self, column: Column) -> usize {
        let wide = |rows: u32, bits: u32| rows >= (1u32 << (16 - bits));
        match column {
            Column::U16 => 2,
            Column::U32 => 4,
            Column::String => 2 + 2 * usize::from(self.wide_strings),
            Column::Guid => 2 + 2 * usize::from(self.wide_guids),
            Column::Blob => 2 + 2 * usize::from(self.wide_blobs),
            Column::Index(table) => 2 + 2 * usize::from(wide(self.tables[table].rows, 0)),
            Column::Coded(tables, bits) => {
                let most = tables
                    .iter()
                    .filter(|&&t| t != NONE)
                    .map(|&t| self.tables[t].rows)
                    .max()
                    .unwrap_or(0);
                2 + 2 * usize::from(wide(most, bits))
            }
        }
    }

    /// Column `column` of row `row` (1-based) of `table`.
    fn cell(&self, table: usize, row: u32, column: usize) -> Option<u32> {
        let info = self.tables.get(table)?;
        if row == 0 || row > info.rows {
            return None;
        }
        let columns = SCHEMA[table];
        let offset: usize = columns[..column].iter().map(|&c| self.width(c)).sum();
        let at = info.start + (row as usize - 1) * info.row_size + offset;
        match self.width(*columns.get(column)?) {
            2 => read_u16(self.tables_stream, at).map(u32::from),
            _ => read_u32(self.tables_stream, at),
        }
    }

    fn string(&self, offset: u32) -> Option<&'a str> {
        let rest = self.strings.get(offset as usize..)?;
        let end = rest.iter().take(MAX_NAME_BYTES + 1).position(|&b| b == 0)?;
        std::str::from_utf8(&rest[..end]).ok()
    }

    fn blob(&self, offset: u32) -> Option<&'a [u8]> {
        let rest = self.blobs.get(offset as usize..)?;
        let (len, used) = compressed(rest)?;
        rest.get(used..used.checked_add(len as usize)?)
    }

    /// The runtime's three strings for method `rid`: declaring type, name, signature.
    pub(super) fn method_strings(&self, rid: u32) -> Option<(String, &'a str, String)> {
        let name = self.string(self.cell(METHOD_DEF, rid, 3)?)?;
        let owner = self.method_lists.partition_point(|&first| first <= rid);
        let owner = u32::try_from(owner).ok().filter(|&o| o > 0)?;
        let mut declaring = String::new();
        self.push_type_def_name(owner, &mut declaring, 0)?;
        let signature = self
            .blob(self.cell(METHOD_DEF, rid, 4)?)
            .and_then(|blob| {
                let mut out = String::new();
                let mut reader = SigReader { bytes: blob, at: 0 };
                self.push_method_sig(&mut reader, &mut out, 0)?;
                (out.len() <= MAX_NAME_BYTES).then_some(out)
            })
            .unwrap_or_default();
        Some((declaring, name, signature))
    }

    /// `TypeString` with `FormatNamespace`: `Ns.Outer+Inner`, reserved characters escaped.
    fn push_type_def_name(&self, row: u32, out: &mut String, depth: usize) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        if let Some(&outer) = self.enclosing.get(&row) {
            self.push_type_def_name(outer, out, depth + 1)?;
            out.push('+');
        }
        let namespace = self.string(self.cell(TYPE_DEF, row, 2)?)?;
        if !namespace.is_empty() {
            push_escaped(namespace, out);
            out.push('.');
        }
        push_escaped(self.string(self.cell(TYPE_DEF, row, 1)?)?, out);
        Some(())
    }

    /// A class as `PrettyPrintClass` names it: `Ns.Name`, or a nested type's own name.
    fn push_class_name(&self, coded: u32, out: &mut String, depth: usize) -> Option<()> {
        let row = coded >> 2;
        let (name, namespace) = match coded & 3 {
            0 => (self.cell(TYPE_DEF, row, 1)?, self.cell(TYPE_DEF, row, 2)?),
            1 => (self.cell(TYPE_REF, row, 1)?, self.cell(TYPE_REF, row, 2)?),
            2 => {
                let blob = self.blob(self.cell(TYPE_SPEC, row, 0)?)?;
                return self.push_type(&mut SigReader { bytes: blob, at: 0 }, out, depth + 1);
            }
            _ => return None,
        };
        let namespace = self.string(namespace)?;
        if !namespace.is_empty() {
            out.push_str(namespace);
            out.push('.');
        }
        out.push_str(self.string(name)?);
        Some(())
    }

    /// `[instance ][generic ]RET  (ARG,ARG)`, as `PrettyPrintSigWorkerInternal` prints it.
    fn push_method_sig(
        &self,
        sig: &mut SigReader<'_>,
        out: &mut String,
        depth: usize,
    ) -> Option<()> {
        let convention = sig.byte()?;
        if convention & 0x20 != 0 {
            out.push_str("instance ");
        }
        if convention & 0x40 != 0 {
            out.push_str("explicit ");
        }
        if convention & 0x10 != 0 {
            out.push_str("generic ");
            sig.compressed()?;
        }
        if convention & 0x0f == 5 {
            out.push_str("vararg ");
        }
        let count = sig.compressed()?;
        self.push_type(sig, out, depth)?;
        out.push_str("  (");
        for i in 0..count {
            if i > 0 {
                out.push(',');
            }
            if sig.peek() == Some(0x41) {
                sig.byte()?;
                out.push_str("...,");
            }
            self.push_type(sig, out, depth)?;
            if out.len() > MAX_NAME_BYTES {
                return None;
            }
        }
        out.push(')');
        Some(())
    }

    fn push_type(&self, sig: &mut SigReader<'_>, out: &mut String, depth: usize) -> Option<()> {
        if depth > MAX_DEPTH || out.len() > MAX_NAME_BYTES {
            return None;
        }
        let depth = depth + 1;
        let element = sig.byte()?;
        let primitive = match element {
            0x01 => "void",
            0x02 => "bool",
            0x03 => "wchar",
            0x04 => "int8",
            0x05 => "unsigned int8",
            0x06 => "int16",
            0x07 => "unsigned int16",
            0x08 => "int32",
            0x09 => "unsigned int32",
            0x0a => "int64",
            0x0b => "unsigned int64",
            0x0c => "float32",
            0x0d => "float64",
            0x0e => "class System.String",
            0x16 => "refany",
            0x18 => "int",
            0x19 => "unsigned int",
            0x1c => "class System.Object",
            _ => "",
        };
        if !primitive.is_empty() {
            out.push_str(primitive);
            return Some(());
        }
        match element {
            0x0f | 0x10 | 0x1d => {
                self.push_type(sig, out, depth)?;
                out.push_str(match element {
                    0x0f => "*",
                    0x10 => "&",
                    _ => "[]",
                });
            }
            0x11 | 0x12 => {
                out.push_str(if element == 0x11 {
                    "value class "
                } else {
                    "class "
                });
                self.push_class_name(sig.compressed()?, out, depth)?;
            }
            0x13 | 0x1e => {
                out.push_str(if element == 0x13 { "!" } else { "!!" });
                out.push_str(&sig.compressed()?.to_string());
            }
            0x14 => {
                self.push_type(sig, out, depth)?;
                let rank = sig.compressed()?;
                for _ in 0..sig.compressed()? {
                    sig.compressed()?;
                }
                for _ in 0..sig.compressed()? {
                    sig.compressed()?;
                }
                if rank == 0 || rank > 32 {
                    return None;
                }
                out.push('[');
                out.extend(std::iter::repeat_n(',', rank as usize - 1));
                out.push(']');
            }
            0x15 => {
                let kind = sig.byte()?;
                out.push_str(if kind == 0x11 {
                    "value class "
                } else {
                    "class "
                });
                self.push_class_name(sig.compressed()?, out, depth)?;
                out.push('<');
                let count = sig.compressed()?;
                for i in 0..count {
                    if i > 0 {
                        out.push(',');
                    }
                    self.push_type(sig, out, depth)?;
                }
                out.push('>');
            }
            0x1b => {
                out.push_str("fnptr ");
                self.push_method_sig(sig, out, depth)?;
            }
            0x1f | 0x20 => {
                out.push_str(if element == 0x1f {
                    "required_modifier "
                } else {
                    "optional_modifier "
                });
                self.push_class_name(sig.compressed()?, out, depth)?;
                out.push(' ');
                self.push_type(sig, out, depth)?;
            }
            0x45 => self.push_type(sig, out, depth)?,
            _ => return None,
        }
        Some(())
    }
}

/// `TypeString` escapes the characters that have a meaning in type names.
fn push_escaped(name: &str, out: &mut String) {
    for c in name.chars() {
        if matches!(c, ',' | '[' | ']' | '&' | '*' | '+' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
}

/// A compressed unsigned integer (II.23.2): its value and how many bytes it took.
fn compressed(bytes: &[u8]) -> Option<(u32, usize)> {
    let first = *bytes.first()?;
    if first & 0x80 == 0 {
        Some((u32::from(first), 1))
    } else if first & 0xc0 == 0x80 {
        Some((
            (u32::from(first & 0x3f) << 8) | u32::from(*bytes.get(1)?),
            2,
        ))
    } else if first & 0xe0 == 0xc0 {
        let rest = bytes.get(1..4)?;
        Some((
            (u32::from(first & 0x1f) << 24)
                | (u32::from(rest[0]) << 16)
                | (u32::from(rest[1]) << 8)
                | u32::from(rest[2]),
            4,
        ))
    } else {
        None
    }
}

struct SigReader<'b> {
    bytes: &'b [u8],
    at: usize,
}

impl SigReader<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn byte(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.at += 1;
        Some(b)
    }

    fn compressed(&mut self) -> Option<u32> {
        let (value, used) = compressed(self.bytes.get(self.at..)?)?;
        self.at += used;
        Some(value)
    }
}
