//! The runtime's "native format" encodings ReadyToRun tables use (`nativeformatreader.h`): variable
//! length unsigned integers and the sparse `NativeArray`. Offsets are RVAs of the image.

use super::pe::PeImage;

/// Elements per block of a [`NativeArray`]; the runtime's `_blockSize`.
const BLOCK_SIZE: u32 = 16;

/// Decodes the unsigned integer at `rva`; returns it and the RVA just past it.
pub(super) fn decode_unsigned(image: &PeImage<'_>, rva: u32) -> Option<(u32, u32)> {
    let first = u32::from(image.byte(rva)?);
    let byte = |i: u32| -> Option<u32> { Some(u32::from(image.byte(rva.checked_add(i)?)?)) };
    if first & 1 == 0 {
        Some((first >> 1, rva.checked_add(1)?))
    } else if first & 2 == 0 {
        Some(((first >> 2) | (byte(1)? << 6), rva.checked_add(2)?))
    } else if first & 4 == 0 {
        Some((
            (first >> 3) | (byte(1)? << 5) | (byte(2)? << 13),
            rva.checked_add(3)?,
        ))
    } else if first & 8 == 0 {
        Some((
            (first >> 4) | (byte(1)? << 4) | (byte(2)? << 12) | (byte(3)? << 20),
            rva.checked_add(4)?,
        ))
    } else if first & 16 == 0 {
        Some((image.u32_at(rva.checked_add(1)?)?, rva.checked_add(5)?))
    } else {
        None
    }
}

/// A sparse array of offsets: element `i` is either absent or the RVA of its data.
pub(super) struct NativeArray<'i, 'a> {
    image: &'i PeImage<'a>,
    base: u32,
    len: u32,
    index_size: u32,
}

impl<'i, 'a> NativeArray<'i, 'a> {
    pub(super) fn new(image: &'i PeImage<'a>, rva: u32) -> Option<Self> {
        let (header, base) = decode_unsigned(image, rva)?;
        Some(Self {
            image,
            base,
            len: header >> 2,
            index_size: header & 3,
        })
    }

    pub(super) fn len(&self) -> u32 {
        self.len
    }

    /// The RVA of element `index`'s data, `None` when absent or malformed.
    pub(super) fn get(&self, index: u32) -> Option<u32> {
        if index >= self.len {
            return None;
        }
        let block = index / BLOCK_SIZE;
        let block_offset = match self.index_size {
            0 => u32::from(self.image.byte(self.base.checked_add(block)?)?),
            1 => u32::from(
                self.image
                    .u16_at(self.base.checked_add(block.checked_mul(2)?)?)?,
            ),
            2 => self
                .image
                .u32_at(self.base.checked_add(block.checked_mul(4)?)?)?,
            _ => return None,
        };
        let mut offset = self.base.checked_add(block_offset)?;
        let mut bit = BLOCK_SIZE >> 1;
        while bit > 0 {
            let (value, next) = decode_unsigned(self.image, offset)?;
            if index & bit != 0 {
                if value & 2 != 0 {
                    offset = offset.checked_add(value >> 2)?;
                    bit >>= 1;
                    continue;
                }
            } else if value & 1 != 0 {
                offset = next;
                bit >>= 1;
                continue;
            }
            // A leaf that stands for exactly one index of the block.
            if value & 3 == 0 && (value >> 2) == (index & (BLOCK_SIZE - 1)) {
                return Some(next);
            }
            return None;
        }
        Some(offset)
    }
}
