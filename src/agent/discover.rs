//! Finding runtimes to profile: rescanning for their own sockets (connect mode) and accepting
//! the ones that dial the agent's socket (listen mode). Each gets a [`process::profile`] task;
//! both loops wait for their tasks when the agent stops.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use collector::client::DiagnosticsClient;
use collector::discovery;
use collector::listen::{ListenOptions, ListenServer, RuntimeEvent, RuntimeInfo};
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinSet;

use super::process::{self, Outcome, Target};
use super::{stopped, Agent};

type Tasks = JoinSet<(PathBuf, anyhow::Result<Outcome>)>;

/// Starts profiling `target` unless a task for `key` runs already.
fn spawn(
    tasks: &mut Tasks,
    known: &mut HashSet<PathBuf>,
    agent: &Arc<Agent>,
    key: PathBuf,
    target: Target,
) {
    if !known.insert(key.clone()) {
        return;
    }
    let agent = agent.clone();
    tasks.spawn(async move {
        let pid = target.pid;
        let result = process::profile(target, agent).await;
        if let Err(error) = &result {
            tracing::warn!(pid, error = %crate::describe(error), "profiling stopped");
        }
        (key, result)
    });
}

/// Waits for every process task (they end on the agent's stop signal).
async fn drain(mut tasks: Tasks) {
    while tasks.join_next().await.is_some() {}
}

/// The longest a socket whose task failed (a stale socket left by a process that exited, a
/// runtime that did not answer) waits before it is tried again: a node has many such sockets, and
/// each try costs a connection and a warning. The wait doubles from one rescan interval.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(60);

/// Rescans for default diagnostic sockets every `interval` and profiles each new one.
pub async fn connect_mode(agent: Arc<Agent>, interval: Duration) -> anyhow::Result<()> {
    let mut tasks = Tasks::new();
    // Sockets seen, with their task. A socket's name holds the pid and start time, so a
    // restarted process is a new entry; a task that failed is forgotten, to be retried later.
    let mut known = HashSet::new();
    // Sockets whose task failed: when to try again, and how many times it failed.
    let mut failed: HashMap<PathBuf, (tokio::time::Instant, u32)> = HashMap::new();
    let shutdown = agent.shutdown.clone();
    let mut scanner = discovery::Scanner::new(Path::new("/proc"));
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            Some(done) = tasks.join_next() => {
                if let Ok((socket, Err(_))) = done {
                    known.remove(&socket);
                    let (retry_at, failures) = failed.entry(socket).or_insert((tokio::time::Instant::now(), 0));
                    let wait = interval.saturating_mul(1 << (*failures).min(16)).min(MAX_RETRY_WAIT);
                    *retry_at = tokio::time::Instant::now() + wait;
                    *failures += 1;
                }
                continue;
            }
            () = stopped(shutdown.clone()) => break,
        }
        let sockets = match scanner.scan() {
            Ok(sockets) => sockets,
            Err(error) => {
                tracing::warn!(%error, "scanning for .NET processes failed");
                continue;
            }
        };
        let present: HashSet<&PathBuf> = sockets.iter().map(|s| &s.path).collect();
        known.retain(|path| present.contains(path));
        failed.retain(|path, _| present.contains(path));
        let now = tokio::time::Instant::now();
        for socket in &sockets {
            if failed
                .get(&socket.path)
                .is_some_and(|(retry_at, _)| *retry_at > now)
            {
                continue;
            }
            // A pid filter is known before connecting: other runtimes are never asked.
            if socket.path_too_long()
                || !agent.settings.filters.may_accept_pid(u64::from(socket.pid))
            {
                continue;
            }
            let target = Target {
                client: DiagnosticsClient::for_socket(&socket.path),
                pid: u64::from(socket.pid),
                transport: "connect",
            };
            spawn(&mut tasks, &mut known, &agent, socket.path.clone(), target);
        }
    }
    drain(tasks).await;
    Ok(())
}

/// Binds the listen socket (mode 0600), holding `max_runtimes` at most. A runtime that waits for a
/// tool at startup is resumed by its process task once its light session streams
/// (`process::profile`), so no code runs unseen.
pub async fn bind_listen(path: &Path, max_runtimes: usize) -> anyhow::Result<ListenServer> {
    ListenServer::bind(
        path,
        ListenOptions {
            resume_on_attach: false,
            max_runtimes,
        },
    )
    .await
    .with_context(|| format!("listening on {}", path.display()))
}

/// Profiles every runtime that dials `server`.
pub async fn listen_mode(agent: Arc<Agent>, server: Arc<ListenServer>) -> anyhow::Result<()> {
    let mut tasks = Tasks::new();
    let mut events = server.subscribe();
    let shutdown = agent.shutdown.clone();
    // Listen-mode runtimes have no socket of their own: they are known by cookie.
    let mut known = HashSet::new();
    let start = |tasks: &mut Tasks, known: &mut HashSet<PathBuf>, info: RuntimeInfo| {
        let target = Target {
            client: server.client(info),
            pid: info.pid,
            transport: "listen",
        };
        spawn(
            tasks,
            known,
            &agent,
            PathBuf::from(info.cookie.to_string()),
            target,
        );
    };
    for info in server.runtimes() {
        start(&mut tasks, &mut known, info);
    }
    loop {
        tokio::select! {
            event = events.recv() => match event {
                Ok(RuntimeEvent::Attached(info)) => start(&mut tasks, &mut known, info),
                Ok(RuntimeEvent::Detached(_)) => {}
                // Missed announcements: look at who is connected now.
                Err(RecvError::Lagged(_)) => {
                    for info in server.runtimes() {
                        start(&mut tasks, &mut known, info);
                    }
                }
                Err(RecvError::Closed) => break,
            },
            // A runtime is never seen again once its task ends: restarts get a new cookie.
            Some(Ok((key, _))) = tasks.join_next() => {
                known.remove(&key);
            }
            () = stopped(shutdown.clone()) => break,
        }
    }
    drain(tasks).await;
    Ok(())
}
