//! `clrscope incident list|export`: the incidents of an agent's data directory, read with the
//! agent stopped (a running agent holds the store's lock: ask it for
//! `GET /api/v1/incidents/{id}/bundle` instead). Export writes the same bundle as that route
//! ([`ui::bundle`]), without the logs and exceptions only a running agent keeps.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use anyhow::Context;
use store::incidents::IncidentFilter;
use store::tsdb::{QueryControl, Store, StoreOptions};
use ui::bundle::{self, BundleParts};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// The incidents kept, newest first, as JSON lines.
    List {
        /// The agent's data directory.
        #[arg(long, value_name = "DIR", default_value = "./clrscope-data")]
        data_dir: PathBuf,
    },
    /// One incident's bundle: a self-contained HTML page with its data (pprof before and
    /// during, the diff as JSON, profile totals as CSV), which opens offline.
    Export {
        /// The incident's id (`clrscope incident list` shows them).
        id: u64,
        /// The agent's data directory.
        #[arg(long, value_name = "DIR", default_value = "./clrscope-data")]
        data_dir: PathBuf,
        /// Where to write the bundle (created 0600). [default: clrscope-incident-ID.html]
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
}

fn open(data_dir: &PathBuf) -> anyhow::Result<Store> {
    anyhow::ensure!(
        data_dir.is_dir(),
        "{} is not a data directory (give the agent's --data-dir)",
        data_dir.display()
    );
    Store::open(data_dir, StoreOptions::default())
        .with_context(|| format!("opening the store in {}", data_dir.display()))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Command::List { data_dir } => {
            let store = open(&data_dir)?;
            let mut out = std::io::stdout().lock();
            for incident in store.incidents().list(&IncidentFilter::default()) {
                serde_json::to_writer(&mut out, &incident)?;
                writeln!(out)?;
            }
            Ok(())
        }
        Command::Export {
            id,
            data_dir,
            output,
        } => {
            let store = open(&data_dir)?;
            let incident = store.incidents().get(id).with_context(|| {
                format!(
                    "no incident {id} in {} (`clrscope incident list`)",
                    data_dir.display()
                )
            })?;
            let parts = BundleParts::collect(&store, &incident, &QueryControl::default())?;
            let body = bundle::write(&incident, &parts, &bundle::Signals::new());
            let path = output.unwrap_or_else(|| PathBuf::from(bundle::file_name(&incident)));
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&path)
                .with_context(|| format!("creating {}", path.display()))?;
            file.write_all(&body)
                .with_context(|| format!("writing {}", path.display()))?;
            eprintln!("wrote {} ({} bytes)", path.display(), body.len());
            Ok(())
        }
    }
}
