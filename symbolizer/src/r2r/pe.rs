//! Just enough of the PE format to read a managed image by RVA: the section table, the CLI header
//! (ECMA-335 II.25) and where the ReadyToRun header lives.

use super::R2rError;

/// `IMAGE_FILE_MACHINE_AMD64`.
const MACHINE_AMD64: u16 = 0x8664;
/// crossgen2 marks Linux images by XOR-ing the machine with this value
/// (`IMAGE_FILE_MACHINE_NATIVE_OS_OVERRIDE` for Linux in the runtime's `pedecoder.h`).
const LINUX_OVERRIDE: u16 = 0x7B79;
/// Index of the CLI header in the optional header's data directories.
const CLI_HEADER_DIRECTORY: u32 = 14;
/// More sections than any real image has; a bound for hostile headers.
const MAX_SECTIONS: u16 = 96;

#[derive(Clone, Copy, Debug)]
struct Section {
    virtual_address: u32,
    raw_pointer: u32,
    raw_size: u32,
}

/// A PE file in memory, read by RVA.
pub(super) struct PeImage<'a> {
    bytes: &'a [u8],
    sections: Vec<Section>,
    /// The CLI header's `(rva, size)`.
    pub(super) cli_header: (u32, u32),
}

impl<'a> PeImage<'a> {
    pub(super) fn parse(bytes: &'a [u8]) -> Result<Self, R2rError> {
        let not_pe = || R2rError::NotManaged("no PE header");
        if bytes.get(..2) != Some(b"MZ") {
            return Err(not_pe());
        }
        let pe = read_u32(bytes, 0x3c).ok_or_else(not_pe)? as usize;
        if bytes.get(pe..pe.checked_add(4).ok_or_else(not_pe)?) != Some(b"PE\0\0") {
            return Err(not_pe());
        }
        let coff = pe + 4;
        let machine = read_u16(bytes, coff).ok_or_else(not_pe)?;
        if machine != MACHINE_AMD64 && machine != MACHINE_AMD64 ^ LINUX_OVERRIDE {
            return Err(R2rError::UnsupportedMachine(machine));
        }
        let section_count = read_u16(bytes, coff + 2).ok_or_else(not_pe)?;
        if section_count > MAX_SECTIONS {
            return Err(R2rError::Malformed("too many sections"));
        }
        let optional_size = usize::from(read_u16(bytes, coff + 16).ok_or_else(not_pe)?);
        let optional = coff + 20;
        let (count_at, directories_at) = match read_u16(bytes, optional) {
            Some(0x20b) => (optional + 108, optional + 112),
            Some(0x10b) => (optional + 92, optional + 96),
            _ => return Err(not_pe()),
        };
        let directory_count = read_u32(bytes, count_at).ok_or_else(not_pe)?;
        if directory_count <= CLI_HEADER_DIRECTORY {
            return Err(R2rError::NotManaged("no CLI header"));
        }
        let cli_at = directories_at + CLI_HEADER_DIRECTORY as usize * 8;
        let cli_header = (
            read_u32(bytes, cli_at).ok_or_else(not_pe)?,
            read_u32(bytes, cli_at + 4).ok_or_else(not_pe)?,
        );
        if cli_header.0 == 0 {
            return Err(R2rError::NotManaged("no CLI header"));
        }
        let table = optional + optional_size;
        let sections = (0..usize::from(section_count))
            .map(|i| {
                let at = table + i * 40;
                Some(Section {
                    virtual_address: read_u32(bytes, at + 12)?,
                    raw_size: read_u32(bytes, at + 16)?,
                    raw_pointer: read_u32(bytes, at + 20)?,
                })
            })
            .collect::<Option<Vec<_>>>()
            .ok_or(R2rError::Malformed("truncated section table"))?;
        Ok(Self {
            bytes,
            sections,
            cli_header,
        })
    }

    /// The file bytes from `rva` to the end of its section's raw data.
    pub(super) fn tail(&self, rva: u32) -> Option<&'a [u8]> {
        // Only bytes the file holds: tables never live in a section's zero-filled tail.
        let section = self
            .sections
            .iter()
            .find(|s| rva >= s.virtual_address && rva - s.virtual_address < s.raw_size)?;
        let start = u64::from(section.raw_pointer) + u64::from(rva - section.virtual_address);
        let end = u64::from(section.raw_pointer) + u64::from(section.raw_size);
        self.bytes
            .get(usize::try_from(start).ok()?..usize::try_from(end).ok()?.min(self.bytes.len()))
    }

    /// `len` bytes at `rva`, all inside one section.
    pub(super) fn slice(&self, rva: u32, len: u32) -> Option<&'a [u8]> {
        self.tail(rva)?.get(..usize::try_from(len).ok()?)
    }

    pub(super) fn byte(&self, rva: u32) -> Option<u8> {
        self.tail(rva)?.first().copied()
    }

    pub(super) fn u16_at(&self, rva: u32) -> Option<u16> {
        read_u16(self.slice(rva, 2)?, 0)
    }

    pub(super) fn u32_at(&self, rva: u32) -> Option<u32> {
        read_u32(self.slice(rva, 4)?, 0)
    }
}

pub(super) fn read_u16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        bytes.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}

pub(super) fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        bytes.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}
