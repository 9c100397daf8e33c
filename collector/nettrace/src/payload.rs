//! The dynamic decoder: any payload whose metadata describes its fields → named values.
//!
//! Values are packed without alignment; strings are NUL-terminated UTF-16; arrays are a u16
//! element count followed by the elements; structs are their fields in order.

use super::cursor::{Cursor, ReadFault, ReadResult};
use super::error::NettraceError;
use super::metadata::{Field, FieldType};
use profile::guid::Guid;

/// Most values one payload may expand into. Arrays of empty structs consume no input, so without
/// a budget a small payload could describe billions of values.
const MAX_VALUES: usize = 1 << 20;

/// A decoded payload value.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Value<'a> {
    /// Boolean (4-byte on the wire).
    Bool(bool),
    /// One UTF-16 code unit (a lone surrogate becomes U+FFFD).
    Char(char),
    /// Signed byte.
    I8(i8),
    /// Byte.
    U8(u8),
    /// 16-bit signed.
    I16(i16),
    /// 16-bit unsigned.
    U16(u16),
    /// 32-bit signed.
    I32(i32),
    /// 32-bit unsigned.
    U32(u32),
    /// 64-bit signed.
    I64(i64),
    /// 64-bit unsigned.
    U64(u64),
    /// Single precision.
    F32(f32),
    /// Double precision.
    F64(f64),
    /// Raw .NET decimal bytes.
    Decimal([u8; 16]),
    /// FILETIME ticks (100 ns since 1601 UTC); see [`filetime_to_unix_nanos`](super::time::filetime_to_unix_nanos).
    DateTime(i64),
    /// GUID.
    Guid(Guid),
    /// String.
    String(String),
    /// Nested struct.
    Struct(Vec<NamedValue<'a>>),
    /// Array.
    Array(Vec<Value<'a>>),
}

/// A field name with its value; the name borrows from the metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedValue<'a> {
    /// Field name.
    pub name: &'a str,
    /// Value.
    pub value: Value<'a>,
}

impl<'a> Value<'a> {
    /// Any numeric value (or a numeric string) as `f64`.
    pub fn as_f64(&self) -> Option<f64> {
        Some(match self {
            Value::I8(v) => f64::from(*v),
            Value::U8(v) => f64::from(*v),
            Value::I16(v) => f64::from(*v),
            Value::U16(v) => f64::from(*v),
            Value::I32(v) => f64::from(*v),
            Value::U32(v) => f64::from(*v),
            Value::I64(v) => *v as f64,
            Value::U64(v) => *v as f64,
            Value::F32(v) => f64::from(*v),
            Value::F64(v) => *v,
            Value::String(s) => s.trim().parse().ok()?,
            _ => return None,
        })
    }

    /// Any integer value as `i64` (`None` if it does not fit).
    pub fn as_i64(&self) -> Option<i64> {
        Some(match self {
            Value::I8(v) => i64::from(*v),
            Value::U8(v) => i64::from(*v),
            Value::I16(v) => i64::from(*v),
            Value::U16(v) => i64::from(*v),
            Value::I32(v) => i64::from(*v),
            Value::U32(v) => i64::from(*v),
            Value::I64(v) => *v,
            Value::U64(v) => i64::try_from(*v).ok()?,
            Value::String(s) => s.trim().parse().ok()?,
            _ => return None,
        })
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// A field of a struct value, by name.
    pub fn field(&self, name: &str) -> Option<&Value<'a>> {
        match self {
            Value::Struct(fields) => find(fields, name),
            _ => None,
        }
    }
}

/// The value of the field called `name`, if present.
pub fn find<'v, 'a>(fields: &'v [NamedValue<'a>], name: &str) -> Option<&'v Value<'a>> {
    fields.iter().find(|f| f.name == name).map(|f| &f.value)
}

/// The number in the field called `name`, if present and numeric.
pub(crate) fn find_number(fields: &[NamedValue<'_>], name: &str) -> Option<f64> {
    find(fields, name).and_then(Value::as_f64)
}

/// Decodes `payload` (at stream offset `offset`) as laid out by `fields`.
/// `event` names the event in error messages and is only called on failure.
pub fn decode_payload<'a>(
    fields: &'a [Field],
    payload: &[u8],
    offset: u64,
    event: impl FnOnce() -> String,
) -> Result<Vec<NamedValue<'a>>, NettraceError> {
    decode_payload_fields(fields, payload, offset, event, |_| true)
}

/// [`decode_payload`] with only the fields `wanted` names, at any depth (structs are entered
/// whatever their name): the others are read past without building their values, so a caller
/// that reads a few fields of a chatty payload (EventCounters' display strings) pays for those.
pub(crate) fn decode_payload_fields<'a>(
    fields: &'a [Field],
    payload: &[u8],
    offset: u64,
    event: impl FnOnce() -> String,
    wanted: fn(&str) -> bool,
) -> Result<Vec<NamedValue<'a>>, NettraceError> {
    let mut d = Decoder {
        c: Cursor::new(payload, offset),
        payload,
        base: offset,
        budget: MAX_VALUES,
        wanted,
    };
    d.fields(fields).map_err(|f| NettraceError::Payload {
        event: event(),
        offset: f.offset,
        reason: f.reason,
    })
}

struct Decoder<'p> {
    c: Cursor<'p>,
    /// The whole payload and its stream offset: DataLoc positions count from its start.
    payload: &'p [u8],
    base: u64,
    budget: usize,
    /// Fields outside structs whose values are built; the others are read past.
    wanted: fn(&str) -> bool,
}

impl Decoder<'_> {
    fn fields<'a>(&mut self, fields: &'a [Field]) -> ReadResult<Vec<NamedValue<'a>>> {
        let mut out = Vec::with_capacity(fields.len());
        for f in fields {
            if !matches!(f.ty, FieldType::Struct(_)) && !(self.wanted)(&f.name) {
                self.skip(&f.ty)?;
                continue;
            }
            let value = self.value(&f.ty)?;
            out.push(NamedValue {
                name: &f.name,
                value,
            });
        }
        Ok(out)
    }

    /// Reads past a value of type `ty`: a string without decoding it, anything else as
    /// [`Decoder::value`] reads it (the same checks and budget).
    fn skip(&mut self, ty: &FieldType) -> ReadResult<()> {
        match ty {
            FieldType::String => {
                self.spend()?;
                self.c.utf16z()?;
            }
            _ => {
                self.value(ty)?;
            }
        }
        Ok(())
    }

    /// Counts one more value against the payload's budget.
    fn spend(&mut self) -> ReadResult<()> {
        if self.budget == 0 {
            return Err(self
                .c
                .fault(format!("payload expands to more than {MAX_VALUES} values")));
        }
        self.budget -= 1;
        Ok(())
    }

    fn value<'a>(&mut self, ty: &'a FieldType) -> ReadResult<Value<'a>> {
        self.spend()?;
        let c = &mut self.c;
        Ok(match ty {
            FieldType::Bool32 => Value::Bool(c.u32()? != 0),
            FieldType::Char16 => Value::Char(
                char::from_u32(u32::from(c.u16()?)).unwrap_or(char::REPLACEMENT_CHARACTER),
            ),
            FieldType::I8 => Value::I8(c.u8()? as i8),
            FieldType::U8 => Value::U8(c.u8()?),
            FieldType::I16 => Value::I16(c.i16()?),
            FieldType::U16 => Value::U16(c.u16()?),
            FieldType::I32 => Value::I32(c.i32()?),
            FieldType::U32 => Value::U32(c.u32()?),
            FieldType::I64 => Value::I64(c.i64()?),
            FieldType::U64 => Value::U64(c.u64()?),
            FieldType::F32 => Value::F32(c.f32()?),
            FieldType::F64 => Value::F64(c.f64()?),
            FieldType::Decimal => Value::Decimal(c.array()?),
            FieldType::DateTime => Value::DateTime(c.i64()?),
            FieldType::Guid => Value::Guid(c.guid()?),
            FieldType::String => Value::String(c.utf16z()?.to_string_lossy()),
            FieldType::Struct(fields) => Value::Struct(self.fields(fields)?),
            FieldType::Array(elem) => {
                let at = c.offset();
                let n = c.u16()?;
                let mut items = Vec::new();
                for _ in 0..n {
                    items.push(self.value(elem).map_err(|f| ReadFault {
                        offset: f.offset,
                        reason: format!("{} (in the array at offset {at})", f.reason),
                    })?);
                }
                Value::Array(items)
            }
            FieldType::FixedArray(elem, n) => {
                let mut items = Vec::new();
                for _ in 0..*n {
                    items.push(self.value(elem)?);
                }
                Value::Array(items)
            }
            FieldType::VarInt => {
                let v = c.var_u64()?;
                Value::I64((v >> 1) as i64 ^ -((v & 1) as i64))
            }
            FieldType::VarUInt => Value::U64(c.var_u64()?),
            FieldType::Utf8CodeUnit => Value::U8(c.u8()?),
            FieldType::Bool8 => Value::Bool(c.u8()? != 0),
            FieldType::RelLoc(elem) | FieldType::DataLoc(elem) => {
                let at = c.offset();
                let loc = c.u32()?;
                let (size, pos) = ((loc >> 16) as usize, (loc & 0xffff) as usize);
                // RelLoc counts from just after the field, DataLoc from the payload start.
                let start = if matches!(ty, FieldType::RelLoc(_)) {
                    (c.offset() - self.base) as usize + pos
                } else {
                    pos
                };
                let Some(data) = self.payload.get(start..start + size) else {
                    return Err(ReadFault {
                        offset: at,
                        reason: format!(
                            "location of {size} bytes at payload offset {start} is outside the {}-byte payload",
                            self.payload.len()
                        ),
                    });
                };
                let elem_size = elem.fixed_size().unwrap_or(0).max(1);
                if size % elem_size != 0 {
                    return Err(ReadFault {
                        offset: at,
                        reason: format!(
                            "{size} bytes is not a whole number of {elem_size}-byte elements"
                        ),
                    });
                }
                let mut sub = Decoder {
                    c: Cursor::new(data, self.base + start as u64),
                    payload: self.payload,
                    base: self.base,
                    budget: self.budget,
                    wanted: self.wanted,
                };
                let mut items = Vec::new();
                while !sub.c.is_empty() {
                    items.push(sub.value(elem)?);
                }
                self.budget = sub.budget;
                Value::Array(items)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::utf16z;

    fn kv() -> FieldType {
        FieldType::Struct(vec![
            Field::new("Key", FieldType::String),
            Field::new("Value", FieldType::String),
        ])
    }

    #[test]
    fn decodes_every_scalar_and_nesting() {
        let fields = vec![
            Field::new("b", FieldType::Bool32),
            Field::new("c", FieldType::Char16),
            Field::new("i8", FieldType::I8),
            Field::new("u16", FieldType::U16),
            Field::new("i64", FieldType::I64),
            Field::new("f", FieldType::F64),
            Field::new("g", FieldType::Guid),
            Field::new("s", FieldType::String),
            Field::new("args", FieldType::Array(Box::new(kv()))),
        ];
        let mut p = Vec::new();
        p.extend(1u32.to_le_bytes());
        p.extend((b'Z' as u16).to_le_bytes());
        p.push(0xff);
        p.extend(7u16.to_le_bytes());
        p.extend((-5i64).to_le_bytes());
        p.extend(2.5f64.to_le_bytes());
        p.extend([1u8; 16]);
        p.extend(utf16z("héllo"));
        p.extend(2u16.to_le_bytes());
        for (k, v) in [("a", "1"), ("b", "2")] {
            p.extend(utf16z(k));
            p.extend(utf16z(v));
        }
        let v = decode_payload(&fields, &p, 0, || "t".into()).unwrap();
        assert_eq!(v[0].value, Value::Bool(true));
        assert_eq!(v[1].value, Value::Char('Z'));
        assert_eq!(v[2].value, Value::I8(-1));
        assert_eq!(v[3].value.as_i64(), Some(7));
        assert_eq!(v[4].value, Value::I64(-5));
        assert_eq!(v[5].value.as_f64(), Some(2.5));
        assert_eq!(v[7].value.as_str(), Some("héllo"));
        let Value::Array(items) = &v[8].value else {
            panic!("array expected")
        };
        assert_eq!(items.len(), 2);
        assert_eq!(items[1].field("Value").and_then(Value::as_str), Some("2"));
    }

    #[test]
    fn unwanted_fields_are_read_past_inside_structs_too() {
        let fields = vec![
            Field::new("skipped", FieldType::String),
            Field::new(
                "Payload",
                FieldType::Struct(vec![
                    Field::new("Name", FieldType::String),
                    Field::new("Series", FieldType::String),
                    Field::new("Mean", FieldType::F64),
                ]),
            ),
        ];
        let mut p = utf16z("not decoded");
        p.extend(utf16z("cpu-usage"));
        p.extend(utf16z("Interval=5000"));
        p.extend(1.5f64.to_le_bytes());
        let wanted = |name: &str| matches!(name, "Name" | "Mean");
        let v = decode_payload_fields(&fields, &p, 0, || "t".into(), wanted).unwrap();
        assert_eq!(v.len(), 1, "{v:?}");
        let payload = &v[0].value;
        assert_eq!(
            payload.field("Name").and_then(Value::as_str),
            Some("cpu-usage")
        );
        assert_eq!(payload.field("Series"), None);
        assert_eq!(payload.field("Mean").and_then(Value::as_f64), Some(1.5));
        // A string read past is still checked: one cut short is an error.
        let cut = &p[..4];
        let e = decode_payload_fields(&fields, cut, 0, || "t".into(), wanted).unwrap_err();
        assert!(e.to_string().contains('t'), "{e}");
    }

    #[test]
    fn short_payload_names_offset_and_event() {
        let fields = vec![Field::new("x", FieldType::U64)];
        let e = decode_payload(&fields, &[1, 2, 3], 1000, || "P/E".into()).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("P/E") && msg.contains("1000"), "{msg}");
    }

    #[test]
    fn value_budget_stops_explosions() {
        // Array of 65535 × struct { array of 65535 empty structs }: 4 bytes describe 4 billion values.
        let inner = FieldType::Array(Box::new(FieldType::Struct(vec![])));
        let outer = FieldType::Array(Box::new(FieldType::Struct(vec![Field::new("in", inner)])));
        let fields = vec![Field::new("x", outer)];
        let mut p = u16::MAX.to_le_bytes().to_vec();
        for _ in 0..u16::MAX {
            p.extend(u16::MAX.to_le_bytes());
        }
        let e = decode_payload(&fields, &p, 0, || "t".into()).unwrap_err();
        assert!(e.to_string().contains("more than"), "{e}");
    }
}
