//! Arguments shared by several commands.

use settings::parse_bytes;

/// The trace parser's memory limit, for every command that parses a nettrace stream.
#[derive(Debug, Clone, clap::Args)]
pub struct NettraceArgs {
    /// Most memory the nettrace parser of one stream may hold for what it decodes (metadata,
    /// stacks, threads, label lists), e.g. 256MiB; a stream that needs more stops with an error
    /// naming this option. [default: 32MiB]
    #[arg(long, value_name = "SIZE", value_parser = parse_bytes)]
    nettrace_budget: Option<u64>,
}

impl NettraceArgs {
    pub fn parser_options(&self) -> nettrace::ParserOptions {
        match self.nettrace_budget {
            Some(bytes) => nettrace::ParserOptions::with_memory_budget(
                usize::try_from(bytes).unwrap_or(usize::MAX),
            ),
            None => nettrace::ParserOptions::default(),
        }
    }
}
