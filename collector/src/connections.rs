//! Who else is connected to a runtime's diagnostics socket: another tool's EventPipe session is
//! one connection, open while the session runs, so its end is seen as that connection going away.
//!
//! The runtime's side of each connection is listed in the target's `/proc/PID/net/unix` (its
//! network namespace) under the listening socket's path. Which of them are the agent's own is
//! learnt once, when a connection is first seen: the agent's own sockets (`/proc/self/fd`) whose
//! peer (`sock_diag`, `UNIX_DIAG_PEER`, in the agent's namespace) is that connection.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::client::DiagnosticsClient;

/// A connection that went away sooner than this after it was first seen is not taken for a
/// session: a command's connection (process info, a stop) lasts milliseconds.
pub const MIN_SESSION_LIFE: Duration = Duration::from_millis(250);
/// The most of `/proc/PID/net/unix` read: a namespace with more sockets is not watched.
const NET_UNIX_BUDGET: u64 = 16 * 1024 * 1024;
/// The most `sock_diag` replies read in one dump (each holds one socket).
const DIAG_BUDGET: usize = 64 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ConnectionsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is larger than {NET_UNIX_BUDGET} bytes; its connections are not watched")]
    TooLarge { path: String },
    #[error("sock_diag: {0}")]
    Diag(std::io::Error),
}

/// The connections to one runtime's diagnostics socket, as last looked at.
#[derive(Debug)]
pub struct OtherConnections {
    /// The target's `/proc/PID/net/unix`.
    net_unix: String,
    /// The diagnostics socket's file name (the path the runtime bound is in its mount namespace).
    name: OsString,
    /// Connections seen open: the runtime's socket inode, when first seen, whether it is ours.
    seen: HashMap<u64, (Instant, bool)>,
}

impl OtherConnections {
    /// Watches the diagnostics socket `client` connects to in process `pid`; `None` for a runtime
    /// that dials the agent (its connections are all the agent's).
    pub fn new(client: &DiagnosticsClient, pid: u64) -> Option<OtherConnections> {
        let name = client.socket_path()?.file_name()?.to_os_string();
        Some(OtherConnections {
            net_unix: format!("/proc/{pid}/net/unix"),
            name,
            seen: HashMap::new(),
        })
    }

    /// Looks once (blocking: /proc and netlink): whether a connection not the agent's, seen for
    /// at least [`MIN_SESSION_LIFE`], went away since the last look.
    pub fn look(&mut self) -> Result<bool, ConnectionsError> {
        let open = self.open_connections()?;
        let now = Instant::now();
        let mut other_ended = false;
        self.seen.retain(|ino, (since, ours)| {
            let kept = open.contains(ino);
            if !kept && !*ours && now.duration_since(*since) >= MIN_SESSION_LIFE {
                other_ended = true;
            }
            kept
        });
        let new: HashSet<u64> = open
            .into_iter()
            .filter(|ino| !self.seen.contains_key(ino))
            .collect();
        if !new.is_empty() {
            let ours = our_peers(&new)?;
            for ino in new {
                self.seen.insert(ino, (now, ours.contains(&ino)));
            }
        }
        Ok(other_ended)
    }

    /// The runtime's side of every connection to the diagnostics socket (inodes).
    fn open_connections(&self) -> Result<HashSet<u64>, ConnectionsError> {
        let read = |source| ConnectionsError::Read {
            path: self.net_unix.clone(),
            source,
        };
        let file = std::fs::File::open(&self.net_unix).map_err(read)?;
        let mut text = String::new();
        file.take(NET_UNIX_BUDGET + 1)
            .read_to_string(&mut text)
            .map_err(read)?;
        if text.len() as u64 > NET_UNIX_BUDGET {
            return Err(ConnectionsError::TooLarge {
                path: self.net_unix.clone(),
            });
        }
        Ok(connections_to(&text, &self.name))
    }
}

/// `/proc/net/unix`'s connected sockets (state 03) bound to a path whose file name is `name`.
fn connections_to(net_unix: &str, name: &OsString) -> HashSet<u64> {
    let mut open = HashSet::new();
    for line in net_unix.lines().skip(1) {
        // Num RefCount Protocol Flags Type St Inode Path
        let mut fields = line.split_whitespace();
        let (Some(state), Some(inode), Some(path)) = (fields.nth(5), fields.next(), fields.next())
        else {
            continue;
        };
        if state != "03" || Path::new(path).file_name() != Some(name.as_os_str()) {
            continue;
        }
        if let Ok(ino) = inode.parse::<u64>() {
            // 0: not accepted yet, no inode to know it by.
            if ino != 0 {
                open.insert(ino);
            }
        }
    }
    open
}

/// Which of `connections` (the runtime's sockets) have one of this process's sockets as peer.
fn our_peers(connections: &HashSet<u64>) -> Result<HashSet<u64>, ConnectionsError> {
    let mine = own_sockets();
    let peers = diag::unix_peers().map_err(ConnectionsError::Diag)?;
    Ok(peers
        .into_iter()
        .filter(|(ino, peer)| mine.contains(ino) && connections.contains(peer))
        .map(|(_, peer)| peer)
        .collect())
}

/// This process's socket inodes.
fn own_sockets() -> HashSet<u64> {
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
        return HashSet::new();
    };
    fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_str()?;
            target
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

/// `sock_diag` for Unix sockets (`man 7 sock_diag`).
mod diag {
    use std::io;

    const SOCK_DIAG_BY_FAMILY: u16 = 20;
    const UDIAG_SHOW_PEER: u32 = 0x4;
    const UNIX_DIAG_PEER: u16 = 2;
    const TCP_ESTABLISHED: u32 = 1;
    const NLMSG_HDR: usize = 16;
    /// `struct unix_diag_msg`.
    const DIAG_MSG: usize = 16;

    /// Every connected Unix stream socket of this network namespace and its peer (inodes).
    pub fn unix_peers() -> io::Result<Vec<(u64, u64)>> {
        // SAFETY: plain socket call; the descriptor is owned below.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                libc::NETLINK_SOCK_DIAG,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor nothing else owns.
        let socket = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let fd = std::os::fd::AsRawFd::as_raw_fd(&socket);
        let request = request();
        // SAFETY: the buffer is valid for its length.
        let sent = unsafe { libc::send(fd, request.as_ptr().cast(), request.len(), 0) };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut peers = Vec::new();
        let mut buf = vec![0u8; 32 * 1024];
        let mut total = 0usize;
        loop {
            // SAFETY: the buffer is valid for its length.
            let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let n = n as usize;
            total += n;
            if total > super::DIAG_BUDGET {
                return Err(io::Error::other("sock_diag answered more than its budget"));
            }
            if parse(&buf[..n], &mut peers)? {
                return Ok(peers);
            }
        }
    }

    /// A dump request: connected stream sockets, with their peers.
    fn request() -> Vec<u8> {
        let len = (NLMSG_HDR + 24) as u32;
        let mut m = Vec::with_capacity(len as usize);
        m.extend_from_slice(&len.to_ne_bytes());
        m.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
        m.extend_from_slice(&flags.to_ne_bytes());
        m.extend_from_slice(&[0u8; 8]); // seq, pid
                                        // struct unix_diag_req
        m.push(libc::AF_UNIX as u8);
        m.extend_from_slice(&[0u8; 3]); // protocol, pad
        m.extend_from_slice(&(1u32 << TCP_ESTABLISHED).to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes()); // inode: any
        m.extend_from_slice(&UDIAG_SHOW_PEER.to_ne_bytes());
        m.extend_from_slice(&[0xff; 8]); // cookie: none
        m
    }

    /// Reads one datagram of replies into `peers`; whether the dump is done.
    fn parse(mut buf: &[u8], peers: &mut Vec<(u64, u64)>) -> io::Result<bool> {
        let u16_at = |b: &[u8], at: usize| u16::from_ne_bytes([b[at], b[at + 1]]);
        let u32_at =
            |b: &[u8], at: usize| u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        while buf.len() >= NLMSG_HDR {
            let len = u32_at(buf, 0) as usize;
            if len < NLMSG_HDR || len > buf.len() {
                return Err(io::Error::other("sock_diag: a truncated reply"));
            }
            let kind = u16_at(buf, 4);
            if kind == libc::NLMSG_DONE as u16 {
                return Ok(true);
            }
            if kind == libc::NLMSG_ERROR as u16 {
                let code = if len >= NLMSG_HDR + 4 {
                    i32::from_ne_bytes(buf[16..20].try_into().unwrap_or_default())
                } else {
                    0
                };
                return Err(io::Error::from_raw_os_error(-code));
            }
            let msg = &buf[NLMSG_HDR..len];
            if msg.len() >= DIAG_MSG {
                let ino = u32_at(msg, 4);
                let mut attrs = &msg[DIAG_MSG..];
                while attrs.len() >= 4 {
                    let alen = usize::from(u16_at(attrs, 0));
                    if alen < 4 || alen > attrs.len() {
                        break;
                    }
                    if u16_at(attrs, 2) == UNIX_DIAG_PEER && alen >= 8 {
                        peers.push((u64::from(ino), u64::from(u32_at(attrs, 4))));
                    }
                    let step = ((alen + 3) & !3).min(attrs.len());
                    attrs = &attrs[step..];
                }
            }
            let step = (len + 3) & !3;
            buf = &buf[step.min(buf.len())..];
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_of_the_socket_only() {
        let text = "Num       RefCount Protocol Flags    Type St Inode Path\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 100 /tmp/dotnet-diagnostic-7-1-socket\n\
            0000000000000000: 00000003 00000000 00000000 0001 03 101 /tmp/dotnet-diagnostic-7-1-socket\n\
            0000000000000000: 00000003 00000000 00000000 0001 03 0 /tmp/dotnet-diagnostic-7-1-socket\n\
            0000000000000000: 00000003 00000000 00000000 0001 03 102 /tmp/other\n\
            0000000000000000: 00000003 00000000 00000000 0001 03 103\n\
            garbage\n";
        let open = connections_to(text, &OsString::from("dotnet-diagnostic-7-1-socket"));
        assert_eq!(open, HashSet::from([101]));
    }

    #[test]
    fn a_connection_between_two_of_our_sockets_is_ours() {
        let listener = std::os::unix::net::UnixListener::bind(
            std::env::temp_dir().join(format!("clrscope-connections-{}", std::process::id())),
        )
        .unwrap();
        let path = listener.local_addr().unwrap();
        let path = path.as_pathname().unwrap().to_path_buf();
        let _client = std::os::unix::net::UnixStream::connect(&path).unwrap();
        let (server, _) = listener.accept().unwrap();
        let server_ino = {
            use std::os::unix::fs::MetadataExt;
            let fd = std::os::fd::AsRawFd::as_raw_fd(&server);
            std::fs::metadata(format!("/proc/self/fd/{fd}"))
                .unwrap()
                .ino()
        };
        std::fs::remove_file(&path).ok();
        let ours = our_peers(&HashSet::from([server_ino])).unwrap();
        assert_eq!(ours, HashSet::from([server_ino]));
    }
}
