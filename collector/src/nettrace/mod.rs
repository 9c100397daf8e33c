//! NetTrace streaming parser (placeholder: filled by the nettrace work).
