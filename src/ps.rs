//! `clrscope ps`: the .NET processes this machine can reach, as a table or JSON.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use collector::listen::{ListenOptions, ListenServer};
use collector::processes::{self, ProcessSummary};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only this process.
    #[arg(long)]
    pid: Option<u32>,
    /// Print JSON (an array of objects) instead of a table.
    #[arg(long)]
    json: bool,
    /// Also listen on this socket and list the runtimes that dial it
    /// (`DOTNET_DiagnosticPorts=PATH`); they are resumed if they wait at startup.
    #[arg(long, value_name = "PATH")]
    diagnostic_port: Option<PathBuf>,
    /// How long to wait for runtimes to dial --diagnostic-port.
    #[arg(long, value_name = "SECONDS", default_value_t = 3.0)]
    listen_seconds: f64,
    /// How long each runtime may take to answer.
    #[arg(long, value_name = "SECONDS", default_value_t = 3.0)]
    timeout: f64,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let timeout = seconds(args.timeout, "--timeout")?;
    let mut rows = match args.pid {
        Some(pid) => vec![processes::describe_pid(pid, timeout).await?],
        None => processes::list_connect(timeout).await?,
    };
    if let Some(path) = &args.diagnostic_port {
        let server = ListenServer::bind(path, ListenOptions::default())
            .await
            .with_context(|| format!("listening on {}", path.display()))?;
        tokio::time::sleep(seconds(args.listen_seconds, "--listen-seconds")?).await;
        let mut dialled = processes::list_listen(&server, timeout).await;
        if let Some(pid) = args.pid {
            dialled.retain(|row| row.pid == u64::from(pid));
        }
        rows.extend(dialled);
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &rows)?;
        writeln!(out)?;
    } else if rows.is_empty() {
        writeln!(
            out,
            "no .NET processes found (runtimes ≥ .NET 5 create /tmp/dotnet-diagnostic-PID-*-socket; \
             containers need a shared pid namespace and /tmp)"
        )?;
    } else {
        write_table(&mut out, &rows)?;
    }
    Ok(())
}

fn seconds(value: f64, flag: &str) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(value).map_err(|_| {
        anyhow::anyhow!("{flag} must be a non-negative number of seconds, got {value}")
    })
}

fn write_table(out: &mut impl Write, rows: &[ProcessSummary]) -> std::io::Result<()> {
    let header = [
        "PID",
        "NAME",
        "RUNTIME",
        "OS/ARCH",
        "TRANSPORT",
        "SOCKET",
        "COMMAND LINE",
    ];
    let cells: Vec<[String; 7]> = rows
        .iter()
        .map(|row| {
            let runtime = row
                .runtime_version
                .as_deref()
                // The build hash after `+` is noise in a table; --json keeps it.
                .map(|v| v.split('+').next().unwrap_or(v).to_string())
                .unwrap_or_else(|| "?".into());
            let platform = match (&row.os, &row.arch) {
                (Some(os), Some(arch)) => format!("{os}/{arch}"),
                _ => "?".into(),
            };
            let last = match &row.error {
                Some(error) => format!("error: {error}"),
                None => row.command_line.clone().unwrap_or_default(),
            };
            [
                row.pid.to_string(),
                row.name.clone(),
                runtime,
                platform,
                row.transport.to_string(),
                row.socket.display().to_string(),
                last,
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |out: &mut dyn Write, cells: &[&str]| {
        let (last, rest) = cells.split_last().expect("seven columns");
        for (cell, width) in rest.iter().zip(widths) {
            write!(out, "{cell:<width$}  ")?;
        }
        writeln!(out, "{last}")
    };
    line(out, &header)?;
    for row in &cells {
        let refs: Vec<&str> = row.iter().map(String::as_str).collect();
        line(out, &refs)?;
    }
    Ok(())
}
