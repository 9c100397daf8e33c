//! Profile and artifact egress: pprof, OTLP Profiles, Pyroscope push, folded, speedscope, SVG.
