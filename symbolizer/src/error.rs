//! Why an event was refused. Refused events change nothing in the map; the adapter logs or counts
//! them, the map keeps working.

/// An event the code map will not apply because applying it could only make frames wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EventError {
    /// Code never lives at address 0: the payload was decoded with the wrong layout or is corrupt.
    #[error(
        "method {method_id:#x} reports code at address 0; the event is corrupt or was decoded with \
         the wrong field layout (check the event version against the manifest template)"
    )]
    ZeroStartAddress {
        /// `MethodID` of the refused event.
        method_id: u64,
    },
    /// `start + size` does not fit in 64 bits.
    #[error(
        "method {method_id:#x} at {start:#x} with {size} bytes runs past the end of the address \
         space; the event is corrupt"
    )]
    RangeOverflow {
        /// `MethodID` of the refused event.
        method_id: u64,
        /// `MethodStartAddress`.
        start: u64,
        /// `MethodSize`.
        size: u32,
    },
    /// A size no method has; taking it would hide every method it overlaps.
    #[error(
        "method {method_id:#x} claims {size} bytes of code, more than the {max} any method has; \
         refused so that it cannot hide the methods it would overlap"
    )]
    ImplausibleSize {
        /// `MethodID` of the refused event.
        method_id: u64,
        /// `MethodSize`.
        size: u32,
        /// The largest size accepted.
        max: u32,
    },
}
