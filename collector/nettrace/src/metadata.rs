//! Event metadata: what a MetadataBlock record says about one kind of event.
//!
//! Layout (format V4, plus the V5 tags): `i32 MetadataId, UTF-16z ProviderName, i32 EventId,
//! UTF-16z EventName, i64 Keywords, i32 Version, i32 Level`, then an optional V1 field list
//! (`i32 count`, each `i32 TypeCode [nested fields if Object] UTF-16z name`), then optional tags
//! (`i32 size, u8 kind, body`): kind 1 = OpCode (`u8`), kind 2 = V2Params (a field list where each
//! field is `i32 size, UTF-16z name, i32 TypeCode [i32 element TypeCode if Array] [nested]`).
//!
//! The runtime's own native events (Microsoft-Windows-DotNETRuntime and its rundown provider,
//! the sample profiler) carry "minimum metadata": an empty name and no fields. Their payloads are
//! decoded by the typed decoders in [`events`](super::events), which know the manifest layouts.

use super::budget::{self, Meter};
use super::cursor::{Cursor, ReadFault, ReadResult};
use super::events::EventKind;
use profile::guid::Guid;
use std::mem::size_of;

/// Deepest struct/array nesting accepted in metadata; real EventSources nest two or three levels.
const MAX_NESTING: u32 = 32;

/// The type of one payload field (System.TypeCode numbering, plus Array from V5).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FieldType {
    /// 4-byte boolean (TypeCode 3).
    Bool32,
    /// One UTF-16 code unit (4).
    Char16,
    /// 5.
    I8,
    /// 6.
    U8,
    /// 7.
    I16,
    /// 8.
    U16,
    /// 9.
    I32,
    /// 10.
    U32,
    /// 11.
    I64,
    /// 12.
    U64,
    /// 13.
    F32,
    /// 14.
    F64,
    /// 16 raw bytes of a .NET decimal (15).
    Decimal,
    /// FILETIME ticks, 8 bytes (16).
    DateTime,
    /// 16 bytes (17).
    Guid,
    /// NUL-terminated UTF-16 (18).
    String,
    /// A nested struct of fields laid out in order (TypeCode 1, "Object").
    Struct(Vec<Field>),
    /// A u16 element count followed by the elements (TypeCode 19, V5 V2Params and V6).
    Array(Box<FieldType>),
    /// Zig-zag LEB128 signed integer (20, V6).
    VarInt,
    /// LEB128 unsigned integer (21, V6).
    VarUInt,
    /// Exactly `count` elements, no prefix (22, V6).
    FixedArray(Box<FieldType>, u16),
    /// One UTF-8 code unit (23, V6).
    Utf8CodeUnit,
    /// u32 `size << 16 | position`: `size` bytes of fixed-size elements at `position` bytes
    /// after this field (24, V6).
    RelLoc(Box<FieldType>),
    /// Like RelLoc, position from the start of the payload (25, V6).
    DataLoc(Box<FieldType>),
    /// 1-byte boolean (26, V6).
    Bool8,
}

impl FieldType {
    /// Encoded size when it does not depend on the data (what RelLoc/DataLoc elements need).
    pub fn fixed_size(&self) -> Option<usize> {
        Some(match self {
            FieldType::I8 | FieldType::U8 | FieldType::Utf8CodeUnit | FieldType::Bool8 => 1,
            FieldType::Char16 | FieldType::I16 | FieldType::U16 => 2,
            FieldType::Bool32
            | FieldType::I32
            | FieldType::U32
            | FieldType::F32
            | FieldType::RelLoc(_)
            | FieldType::DataLoc(_) => 4,
            FieldType::I64 | FieldType::U64 | FieldType::F64 | FieldType::DateTime => 8,
            FieldType::Decimal | FieldType::Guid => 16,
            FieldType::Struct(fields) => fields
                .iter()
                .map(|f| f.ty.fixed_size())
                .try_fold(0usize, |acc, s| acc.checked_add(s?))?,
            FieldType::FixedArray(elem, n) => elem.fixed_size()?.checked_mul(usize::from(*n))?,
            FieldType::String | FieldType::Array(_) | FieldType::VarInt | FieldType::VarUInt => {
                return None
            }
        })
    }
}

/// One named payload field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// Field name as the writer declared it.
    pub name: String,
    /// Its type.
    pub ty: FieldType,
}

impl Field {
    pub(crate) fn new(name: &str, ty: FieldType) -> Self {
        Field {
            name: name.to_owned(),
            ty,
        }
    }
}

/// Everything the stream says about one kind of event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventMetadata {
    /// Id that events use to refer to this record.
    pub metadata_id: u32,
    /// Provider (EventSource) name.
    pub provider_name: String,
    /// Provider GUID: the manifest GUID for native runtime providers, else name-derived.
    pub provider_guid: Guid,
    /// Event id within the provider.
    pub event_id: u32,
    /// Event name; empty for native runtime events ("minimum metadata").
    pub event_name: String,
    /// Keyword bits.
    pub keywords: u64,
    /// Event version (payload layouts of runtime events depend on it).
    pub version: u32,
    /// Level: 1 critical … 5 verbose.
    pub level: u32,
    /// OpCode from the V5 OpCode tag or V6 optional metadata, if the writer sent one.
    pub opcode: Option<u8>,
    /// V6 message template, e.g. `"Request {path} took {ms} ms"`.
    pub message_template: Option<String>,
    /// V6 human-readable description.
    pub description: Option<String>,
    /// V6 free-form key/value attributes.
    pub attributes: Vec<(String, String)>,
    /// Payload fields in order; empty when the writer described none.
    pub fields: Vec<Field>,
    /// Stream offset of the record's payload.
    pub offset: u64,
    /// Which typed decoder applies.
    pub kind: EventKind,
}

impl EventMetadata {
    /// True when the payload layout is not described in the stream (native runtime events):
    /// only the typed decoders can read such payloads.
    pub fn is_minimal(&self) -> bool {
        self.fields.is_empty() && self.event_name.is_empty()
    }

    /// Heap bytes held, for the parser's memory budget.
    pub(crate) fn held_bytes(&self) -> usize {
        self.provider_name.capacity()
            + self.event_name.capacity()
            + self.message_template.as_ref().map_or(0, String::capacity)
            + self.description.as_ref().map_or(0, String::capacity)
            + budget::string_pairs(&self.attributes)
            + fields_held(&self.fields)
    }

    /// `Provider/EventName`, or `Provider/#id` when the name is empty; for messages and listings.
    pub fn display_name(&self) -> String {
        if self.event_name.is_empty() {
            format!("{}/#{}", self.provider_name, self.event_id)
        } else {
            format!("{}/{}", self.provider_name, self.event_name)
        }
    }
}

fn fields_held(fields: &Vec<Field>) -> usize {
    fields.capacity() * size_of::<Field>()
        + fields
            .iter()
            .map(|f| f.name.capacity() + type_held(&f.ty))
            .sum::<usize>()
}

fn type_held(ty: &FieldType) -> usize {
    match ty {
        FieldType::Struct(fields) => fields_held(fields),
        FieldType::Array(elem)
        | FieldType::FixedArray(elem, _)
        | FieldType::RelLoc(elem)
        | FieldType::DataLoc(elem) => size_of::<FieldType>() + type_held(elem),
        _ => 0,
    }
}

/// A UTF-16 string, paid for from `meter` before it is allocated (a code unit becomes at most
/// three UTF-8 bytes).
fn utf16_string(c: &mut Cursor<'_>, meter: &mut Meter) -> ReadResult<String> {
    let s = c.utf16z()?;
    meter.spend(c, s.units() * 3)?;
    Ok(s.to_string_lossy())
}

/// Parses one metadata record (the payload of an event blob in a MetadataBlock), paying for
/// what it allocates from `meter`.
pub(crate) fn parse_metadata(mut c: Cursor<'_>, meter: &mut Meter) -> ReadResult<EventMetadata> {
    let offset = c.offset();
    let metadata_id = c.u32()?;
    let provider_name = utf16_string(&mut c, meter)?;
    let event_id = c.u32()?;
    let event_name = utf16_string(&mut c, meter)?;
    let keywords = c.u64()?;
    let version = c.u32()?;
    let level = c.u32()?;
    let mut fields = if c.is_empty() {
        Vec::new()
    } else {
        parse_fields(&mut c, false, 0, meter)?
    };
    let mut opcode = None;
    while !c.is_empty() {
        let size = c.i32()?;
        let kind = c.u8()?;
        let size = usize::try_from(size).map_err(|_| c.fault(format!("tag size {size}")))?;
        let mut body = c.take(size)?;
        match kind {
            1 => opcode = Some(body.u8()?),
            2 => fields = parse_fields(&mut body, true, 0, meter)?,
            // Later tag kinds are skippable by design.
            _ => {}
        }
    }
    let provider_guid = Guid::for_provider(&provider_name);
    if fields.is_empty() {
        fields = well_known_fields(&provider_name, &event_name);
    }
    let kind = EventKind::classify(&provider_name, event_id, &event_name);
    Ok(EventMetadata {
        metadata_id,
        provider_name,
        provider_guid,
        event_id,
        event_name,
        keywords,
        version,
        level,
        opcode,
        message_template: None,
        description: None,
        attributes: Vec::new(),
        fields,
        offset,
        kind,
    })
}

/// Parses one V6 metadata row (after its u16 size): `varuint32 id, string provider,
/// varuint32 eventId, string name, FieldDescriptions, OptionalMetadata`; V6 strings are
/// varuint32-length UTF-8. What it allocates is paid for from `meter`.
pub(crate) fn parse_metadata_v6(mut c: Cursor<'_>, meter: &mut Meter) -> ReadResult<EventMetadata> {
    let offset = c.offset();
    let metadata_id = c.var_u32()?;
    let provider_name = meter.utf8(&mut c)?;
    let event_id = c.var_u32()?;
    let event_name = meter.utf8(&mut c)?;
    let fields = parse_fields_v6(&mut c, 0, meter)?;
    let mut m = EventMetadata {
        metadata_id,
        provider_guid: Guid::for_provider(&provider_name),
        kind: EventKind::classify(&provider_name, event_id, &event_name),
        provider_name,
        event_id,
        event_name,
        keywords: 0,
        version: 0,
        level: 0,
        opcode: None,
        message_template: None,
        description: None,
        attributes: Vec::new(),
        fields,
        offset,
    };
    let size = c.u16()?;
    let mut opt = c.take(usize::from(size))?;
    while !opt.is_empty() {
        match opt.u8()? {
            1 => m.opcode = Some(opt.u8()?),
            3 => m.keywords = opt.u64()?,
            4 => m.message_template = Some(meter.utf8(&mut opt)?),
            5 => m.description = Some(meter.utf8(&mut opt)?),
            6 => {
                meter.spend(&opt, budget::slot::<(String, String)>())?;
                let k = meter.utf8(&mut opt)?;
                m.attributes.push((k, meter.utf8(&mut opt)?));
            }
            7 => m.provider_guid = opt.guid()?,
            8 => m.level = u32::from(opt.u8()?),
            9 => m.version = u32::from(opt.u8()?),
            // Entries carry no length, so an unknown kind hides the rest: keep what was read.
            _ => break,
        }
    }
    // Trailing bytes of the row are reserved for later format versions.
    Ok(m)
}

fn parse_fields_v6(c: &mut Cursor<'_>, depth: u32, meter: &mut Meter) -> ReadResult<Vec<Field>> {
    if depth > MAX_NESTING {
        return Err(c.fault(format!("fields nest deeper than {MAX_NESTING} levels")));
    }
    let count = c.u16()?;
    let mut fields = Vec::new();
    for _ in 0..count {
        let size = c.u16()?;
        let mut body = c.take(usize::from(size))?;
        meter.spend(&body, budget::slot::<Field>())?;
        let name = meter.utf8(&mut body)?;
        let ty = parse_type_v6(&mut body, depth, meter)?;
        fields.push(Field { name, ty });
    }
    Ok(fields)
}

fn parse_type_v6(c: &mut Cursor<'_>, depth: u32, meter: &mut Meter) -> ReadResult<FieldType> {
    if depth > MAX_NESTING {
        return Err(c.fault(format!("types nest deeper than {MAX_NESTING} levels")));
    }
    let at = c.offset();
    let code = c.u8()?;
    if matches!(code, 19 | 22 | 24 | 25) {
        meter.spend(c, size_of::<FieldType>())?;
    }
    let located = |c: &mut Cursor<'_>, meter: &mut Meter| -> ReadResult<Box<FieldType>> {
        let elem = parse_type_v6(c, depth + 1, meter)?;
        if elem.fixed_size().is_none() {
            return Err(ReadFault {
                offset: at,
                reason: "RelLoc/DataLoc element type is not fixed-size".into(),
            });
        }
        Ok(Box::new(elem))
    };
    Ok(match code {
        1 => FieldType::Struct(parse_fields_v6(c, depth + 1, meter)?),
        19 => FieldType::Array(Box::new(parse_type_v6(c, depth + 1, meter)?)),
        20 => FieldType::VarInt,
        21 => FieldType::VarUInt,
        22 => {
            let elem = parse_type_v6(c, depth + 1, meter)?;
            FieldType::FixedArray(Box::new(elem), c.u16()?)
        }
        23 => FieldType::Utf8CodeUnit,
        24 => FieldType::RelLoc(located(c, meter)?),
        25 => FieldType::DataLoc(located(c, meter)?),
        26 => FieldType::Bool8,
        other => scalar(i32::from(other)).ok_or_else(|| ReadFault {
            offset: at,
            reason: format!("unknown field type code {other}"),
        })?,
    })
}

/// The type codes V4, V5 and V6 share.
fn scalar(code: i32) -> Option<FieldType> {
    Some(match code {
        3 => FieldType::Bool32,
        4 => FieldType::Char16,
        5 => FieldType::I8,
        6 => FieldType::U8,
        7 => FieldType::I16,
        8 => FieldType::U16,
        9 => FieldType::I32,
        10 => FieldType::U32,
        11 => FieldType::I64,
        12 => FieldType::U64,
        13 => FieldType::F32,
        14 => FieldType::F64,
        15 => FieldType::Decimal,
        16 => FieldType::DateTime,
        17 => FieldType::Guid,
        18 => FieldType::String,
        _ => return None,
    })
}

fn parse_fields(
    c: &mut Cursor<'_>,
    v2: bool,
    depth: u32,
    meter: &mut Meter,
) -> ReadResult<Vec<Field>> {
    if depth > MAX_NESTING {
        return Err(c.fault(format!("fields nest deeper than {MAX_NESTING} levels")));
    }
    let count = c.i32()?;
    if count < 0 {
        return Err(c.fault(format!("negative field count {count}")));
    }
    // No preallocation from the count: each field consumes input, so a bogus count fails fast.
    let mut fields = Vec::new();
    for _ in 0..count {
        if v2 {
            let size = c.i32()?;
            let body_len = usize::try_from(size)
                .ok()
                .and_then(|s| s.checked_sub(4))
                .ok_or_else(|| c.fault(format!("field size {size} is smaller than 4")))?;
            let mut body = c.take(body_len)?;
            meter.spend(&body, budget::slot::<Field>())?;
            let name = utf16_string(&mut body, meter)?;
            let ty = parse_type(&mut body, true, depth, meter)?;
            fields.push(Field { name, ty });
        } else {
            meter.spend(c, budget::slot::<Field>())?;
            let ty = parse_type(c, false, depth, meter)?;
            let name = utf16_string(c, meter)?;
            fields.push(Field { name, ty });
        }
    }
    Ok(fields)
}

fn parse_type(
    c: &mut Cursor<'_>,
    v2: bool,
    depth: u32,
    meter: &mut Meter,
) -> ReadResult<FieldType> {
    let at = c.offset();
    let code = c.i32()?;
    Ok(match code {
        1 => FieldType::Struct(parse_fields(c, v2, depth + 1, meter)?),
        19 if v2 => {
            if depth > MAX_NESTING {
                return Err(c.fault(format!("arrays nest deeper than {MAX_NESTING} levels")));
            }
            meter.spend(c, size_of::<FieldType>())?;
            FieldType::Array(Box::new(parse_type(c, v2, depth + 1, meter)?))
        }
        19 => {
            return Err(ReadFault {
                offset: at,
                reason: "Array type code outside a V2Params tag".into(),
            })
        }
        other => scalar(other).ok_or_else(|| ReadFault {
            offset: at,
            reason: format!("unknown field type code {other}"),
        })?,
    })
}

/// Layouts that old writers could not describe (format ≤ V4 has no array type), filled in the
/// way TraceEvent does so that DiagnosticSource events decode from any runtime.
fn well_known_fields(provider: &str, event: &str) -> Vec<Field> {
    if provider == "Microsoft-Diagnostics-DiagnosticSource"
        && matches!(
            event,
            "Event"
                | "Activity1Start"
                | "Activity1Stop"
                | "Activity2Start"
                | "Activity2Stop"
                | "RecursiveActivity1Start"
                | "RecursiveActivity1Stop"
        )
    {
        let pair = FieldType::Struct(vec![
            Field::new("Key", FieldType::String),
            Field::new("Value", FieldType::String),
        ]);
        return vec![
            Field::new("SourceName", FieldType::String),
            Field::new("EventName", FieldType::String),
            Field::new("Arguments", FieldType::Array(Box::new(pair))),
        ];
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::MemoryBudget;
    use crate::testutil::{utf16z, MetadataRecord};

    fn meter() -> Meter {
        MemoryBudget::new(1 << 20).meter()
    }

    #[test]
    fn v1_fields_with_nested_struct() {
        // Fields: Int32 "Count", Object { String "Name", Double "Mean" } "Payload".
        let mut fields = Vec::new();
        fields.extend(2i32.to_le_bytes()); // field count
        fields.extend(9i32.to_le_bytes()); // TypeCode Int32
        fields.extend(utf16z("Count"));
        fields.extend(1i32.to_le_bytes()); // TypeCode Object
        fields.extend(2i32.to_le_bytes()); //   nested count
        fields.extend(18i32.to_le_bytes()); //   String
        fields.extend(utf16z("Name"));
        fields.extend(14i32.to_le_bytes()); //   Double
        fields.extend(utf16z("Mean"));
        fields.extend(utf16z("Payload"));
        let rec = MetadataRecord::new(3, "My.Source", 7, "Thing")
            .version(2)
            .raw_fields(fields)
            .opcode_tag(1)
            .encode();
        let m = parse_metadata(Cursor::new(&rec, 100), &mut meter()).unwrap();
        assert_eq!(m.metadata_id, 3);
        assert_eq!(m.provider_name, "My.Source");
        assert_eq!(m.event_id, 7);
        assert_eq!(m.event_name, "Thing");
        assert_eq!(m.version, 2);
        assert_eq!(m.opcode, Some(1));
        assert_eq!(
            m.fields,
            vec![
                Field::new("Count", FieldType::I32),
                Field::new(
                    "Payload",
                    FieldType::Struct(vec![
                        Field::new("Name", FieldType::String),
                        Field::new("Mean", FieldType::F64)
                    ])
                ),
            ]
        );
        assert_eq!(m.offset, 100);
    }

    #[test]
    fn v2_params_with_array_of_struct() {
        // V2Params: one field "Args": Array of Object { String "Key" }.
        let mut f = Vec::new();
        let mut field = Vec::new();
        field.extend(utf16z("Args"));
        field.extend(19i32.to_le_bytes()); // Array
        field.extend(1i32.to_le_bytes()); //  element: Object
        field.extend(1i32.to_le_bytes()); //   nested count
        let mut inner = Vec::new();
        inner.extend(utf16z("Key"));
        inner.extend(18i32.to_le_bytes());
        field.extend(((inner.len() + 4) as i32).to_le_bytes());
        field.extend(inner);
        f.extend(1i32.to_le_bytes()); // V2 count
        f.extend(((field.len() + 4) as i32).to_le_bytes());
        f.extend(field);
        let rec = MetadataRecord::new(1, "P", 1, "E")
            .raw_fields(0i32.to_le_bytes().to_vec())
            .v2_params_tag(f)
            .encode();
        let m = parse_metadata(Cursor::new(&rec, 0), &mut meter()).unwrap();
        assert_eq!(
            m.fields,
            vec![Field::new(
                "Args",
                FieldType::Array(Box::new(FieldType::Struct(vec![Field::new(
                    "Key",
                    FieldType::String
                )])))
            )]
        );
    }

    #[test]
    fn minimal_metadata_without_field_count() {
        let rec = MetadataRecord::new(5, "Microsoft-Windows-DotNETRuntime", 143, "")
            .version(1)
            .level(5)
            .keywords(0x10)
            .no_field_list()
            .encode();
        let m = parse_metadata(Cursor::new(&rec, 0), &mut meter()).unwrap();
        assert!(m.is_minimal());
        assert_eq!(m.keywords, 0x10);
        assert_eq!(m.display_name(), "Microsoft-Windows-DotNETRuntime/#143");
        assert_eq!(
            m.provider_guid.to_string(),
            "e13c0d23-ccbc-4e12-931b-d9cc2eee27e4"
        );
    }

    #[test]
    fn hostile_metadata_fails_cleanly() {
        // Field count of 2^31-1 with no fields behind it.
        let rec = MetadataRecord::new(1, "P", 1, "E")
            .raw_fields(i32::MAX.to_le_bytes().to_vec())
            .encode();
        assert!(parse_metadata(Cursor::new(&rec, 0), &mut meter()).is_err());
        // Deep nesting: Object inside Object ... 100 levels.
        let mut f = Vec::new();
        for _ in 0..100 {
            f.extend(1i32.to_le_bytes());
            f.extend(1i32.to_le_bytes());
        }
        let rec = MetadataRecord::new(1, "P", 1, "E").raw_fields(f).encode();
        let e = parse_metadata(Cursor::new(&rec, 0), &mut meter()).unwrap_err();
        assert!(e.reason.contains("nest"), "{e:?}");
        // Unknown type code.
        let mut f = 1i32.to_le_bytes().to_vec();
        f.extend(99i32.to_le_bytes());
        let rec = MetadataRecord::new(1, "P", 1, "E").raw_fields(f).encode();
        assert!(parse_metadata(Cursor::new(&rec, 0), &mut meter())
            .unwrap_err()
            .reason
            .contains("99"));
    }

    #[test]
    fn diagnostic_source_gets_well_known_layout() {
        let rec = MetadataRecord::new(2, "Microsoft-Diagnostics-DiagnosticSource", 3, "Event")
            .raw_fields(0i32.to_le_bytes().to_vec())
            .encode();
        let m = parse_metadata(Cursor::new(&rec, 0), &mut meter()).unwrap();
        assert_eq!(m.fields.len(), 3);
        assert_eq!(m.fields[2].name, "Arguments");
    }
}
