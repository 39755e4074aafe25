//! The local control socket of a running target: `rsv target status` and `rsv target
//! drop` ask over it. A Unix stream socket (`[control] socket`, `--control-socket`, or
//! `$RUNTIME_DIRECTORY/control.sock` under systemd); one JSON request line, one JSON
//! response line, then the socket closes ([`proto`], sans-IO).
//!
//! Who may ask: the socket file's mode (0600, or 0660 with `[control] group`) is the
//! first guard, checked by the kernel at connect; the peer's credentials (SO_PEERCRED)
//! are the second: root, the target's own user, or a member of the configured group. The
//! second covers what the first cannot: the moment between bind and chmod, a mode
//! loosened by hand, a connected socket handed to another process (`docs/security.md`).

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tracing::{debug, info, warn};

use crate::session::{ConnEvent, Session};
use crate::shared::Shared;
use crate::status::Source;

pub mod proto;

use proto::{DropOutcome, Dropped, Request, RequestReader, Response};

/// The socket's file name in systemd's RuntimeDirectory, when none is configured.
pub const DEFAULT_NAME: &str = "control.sock";

/// How long a client may take to send its request.
const REQUEST_WITHIN: Duration = Duration::from_secs(5);
/// How often a drop looks whether the session has gone.
const DROP_POLL: Duration = Duration::from_millis(50);

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("control socket {0}: another process serves it (a target already running?)")]
    InUse(PathBuf),
    #[error("control socket {0}: exists and is not a socket; not replacing it")]
    NotASocket(PathBuf),
    #[error("control socket {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("control socket group {0}: no such group")]
    NoGroup(String),
}

/// Where the control socket goes when the configuration names none: systemd's
/// RuntimeDirectory (its first, when it names several), else nowhere.
pub fn default_path() -> Option<PathBuf> {
    let dirs = std::env::var_os("RUNTIME_DIRECTORY")?;
    let first = dirs.to_str()?.split(':').next().filter(|d| !d.is_empty())?;
    Some(Path::new(first).join(DEFAULT_NAME))
}

/// A bound control socket; dropping it removes its file (if it is still ours).
pub struct ControlSocket {
    listener: UnixListener,
    path: PathBuf,
    /// The inode bound, so that a drop removes no file another process put there since.
    ino: u64,
    group: Option<u32>,
}

impl ControlSocket {
    /// Binds `path` with mode 0600, or 0660 and group `group`. A socket file already
    /// there that nobody serves (left by a target that was killed) is replaced; one that
    /// is served, and anything that is not a socket, is an error and left alone. Must be
    /// called within a tokio runtime.
    pub fn bind(path: &Path, group: Option<&str>) -> Result<ControlSocket, ControlError> {
        let io_err = |source| ControlError::Io {
            path: path.to_owned(),
            source,
        };
        let gid = group.map(resolve_group).transpose()?;
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_socket() => {
                match std::os::unix::net::UnixStream::connect(path) {
                    Ok(_) => return Err(ControlError::InUse(path.to_owned())),
                    Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                        info!("control socket {}: stale; replacing it", path.display());
                        std::fs::remove_file(path).map_err(io_err)?;
                    }
                    Err(e) => return Err(io_err(e)),
                }
            }
            Ok(_) => return Err(ControlError::NotASocket(path.to_owned())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(e)),
        }
        let listener = UnixListener::bind(path).map_err(io_err)?;
        // Until the mode is set, the peer check below still holds.
        if let Some(gid) = gid {
            std::os::unix::fs::chown(path, None, Some(gid)).map_err(io_err)?;
        }
        let mode = if gid.is_some() { 0o660 } else { 0o600 };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(io_err)?;
        let ino = std::fs::symlink_metadata(path).map_err(io_err)?.ino();
        Ok(ControlSocket {
            listener,
            path: path.to_owned(),
            ino,
            group: gid,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Answers requests for as long as it is polled, each client on a task of its own.
    pub async fn serve(&self, source: Source) -> std::convert::Infallible {
        let owner = nix_euid();
        loop {
            let (stream, _) = match self.listener.accept().await {
                Ok(s) => s,
                Err(e) => {
                    warn!("control socket {}: accept: {e}", self.path.display());
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let shared = source.0.clone();
            let group = self.group;
            tokio::spawn(async move {
                if let Err(e) = answer(stream, shared, owner, group).await {
                    debug!("control socket: {e}");
                }
            });
        }
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.ino) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn nix_euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// A group by name or number.
fn resolve_group(name: &str) -> Result<u32, ControlError> {
    if let Ok(gid) = name.parse() {
        return Ok(gid);
    }
    let c = std::ffi::CString::new(name).map_err(|_| ControlError::NoGroup(name.into()))?;
    // SAFETY: `group` is plain old data (integers and pointers); all zeroes is a valid
    // value, which getgrnam_r overwrites.
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut found: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; buf outlives the reads of `grp`.
    let rc = unsafe {
        libc::getgrnam_r(
            c.as_ptr(),
            &mut grp,
            buf.as_mut_ptr(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 || found.is_null() {
        return Err(ControlError::NoGroup(name.into()));
    }
    Ok(grp.gr_gid)
}

/// The peer's supplementary groups as they were when it connected (SO_PEERGROUPS):
/// the kernel's record, not `/proc` (which `ProtectProc=invisible` hides, and whose PID
/// could be another process's by the time it is read).
fn peer_groups(fd: std::os::fd::BorrowedFd<'_>) -> Vec<u32> {
    use std::os::fd::AsRawFd;
    let mut groups = vec![0 as libc::gid_t; 64];
    loop {
        let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: `groups` is writable for `len` bytes; the kernel writes at most that and
        // says how much in `len`.
        let rc = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let n = len as usize / std::mem::size_of::<libc::gid_t>();
        if rc == 0 {
            groups.truncate(n);
            return groups;
        }
        // ERANGE: too small, and `len` says what it needs (NGROUPS_MAX is 65536).
        if io::Error::last_os_error().raw_os_error() != Some(libc::ERANGE) || n <= groups.len() {
            return Vec::new();
        }
        groups.resize(n, 0);
    }
}

/// Whether a peer with these credentials may use the socket: root, the target's own
/// user, or a member of the configured group by its primary or supplementary groups.
fn admitted(
    cred: &tokio::net::unix::UCred,
    groups: impl FnOnce() -> Vec<u32>,
    owner: u32,
    group: Option<u32>,
) -> bool {
    let uid = cred.uid();
    uid == 0 || uid == owner || group.is_some_and(|g| cred.gid() == g || groups().contains(&g))
}

async fn answer(
    mut stream: UnixStream,
    shared: Arc<Shared>,
    owner: u32,
    group: Option<u32>,
) -> io::Result<()> {
    let cred = stream.peer_cred()?;
    let groups = || {
        use std::os::fd::AsFd;
        peer_groups(stream.as_fd())
    };
    if !admitted(&cred, groups, owner, group) {
        warn!(
            "control socket: refused uid {} gid {} (pid {:?}): only root, the target's user \
             or the configured group",
            cred.uid(),
            cred.gid(),
            cred.pid()
        );
        let r = Response::Error(format!(
            "refused: uid {} may not use this target's control socket",
            cred.uid()
        ));
        return send(&mut stream, &r).await;
    }
    let request = match tokio::time::timeout(REQUEST_WITHIN, read_request(&mut stream)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return send(&mut stream, &Response::Error(e.to_string())).await,
        Err(_) => {
            let r = Response::Error(format!("no request within {REQUEST_WITHIN:?}"));
            return send(&mut stream, &r).await;
        }
    };
    debug!("control socket: uid {}: {request:?}", cred.uid());
    let response = match request {
        Request::Status => Response::Status(Source(shared).snapshot()),
        Request::Drop { session, wait_s } => {
            info!(
                "control socket: uid {} drops session {session} (logout asked within {wait_s} s)",
                cred.uid()
            );
            match drop_session(&shared, session, wait_s).await {
                Ok(d) => Response::Dropped(d),
                Err(e) => Response::Error(e),
            }
        }
    };
    send(&mut stream, &response).await
}

/// Reads one request line (or what came before the client shut its side).
async fn read_request(stream: &mut UnixStream) -> Result<Request, proto::ProtoError> {
    let mut reader = RequestReader::default();
    let mut buf = [0u8; 1024];
    loop {
        let n = stream
            .read(&mut buf)
            .await
            .map_err(|e| proto::ProtoError::Io(e.to_string()))?;
        if n == 0 {
            return reader.finish();
        }
        if let Some(r) = reader.feed(&buf[..n])? {
            return Ok(r);
        }
    }
}

/// Answers, then reads what the client still sends (at most 64 KiB, for at most a
/// second) before the socket closes: a Unix socket closed with unread data resets its
/// peer, whose read could then lose the answer (a refusal comes before the request is
/// read; an oversized request is left unread).
async fn send(stream: &mut UnixStream, r: &Response) -> io::Result<()> {
    stream.write_all(&proto::encode(r)).await?;
    stream.shutdown().await?;
    let drain = async {
        let mut buf = [0u8; 4096];
        let mut left = 64 * 1024usize;
        while left > 0 {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
    Ok(())
}

fn still_there(shared: &Shared, s: &Arc<Session>) -> bool {
    shared.session(s.tsih).is_some_and(|x| Arc::ptr_eq(&x, s))
}

/// Ends session `tsih`: asks its initiator to log out within `wait_s` seconds (Async
/// Message event 1 on each connection, RFC 7143 11.9.1), waits for it to go, and closes
/// its connections when it has not by then (at once when `wait_s` is 0).
async fn drop_session(shared: &Shared, tsih: u16, wait_s: u16) -> Result<Dropped, String> {
    let s = shared
        .session(tsih)
        .ok_or_else(|| format!("no session {tsih}"))?;
    if wait_s > 0 {
        s.broadcast(|| ConnEvent::RequestLogout(wait_s));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(wait_s.into());
        while tokio::time::Instant::now() < deadline {
            if !still_there(shared, &s) {
                let outcome = if s.logged_out() {
                    DropOutcome::LoggedOut
                } else {
                    DropOutcome::ClosedByInitiator
                };
                info!("session {tsih} of {}: {outcome}", s.initiator);
                return Ok(Dropped { tsih, outcome });
            }
            tokio::time::sleep(DROP_POLL).await;
        }
    }
    if still_there(shared, &s) {
        s.close();
        s.broadcast(|| ConnEvent::Close("dropped by the administrator"));
        shared.remove_session(tsih);
    }
    info!(
        "session {tsih} of {}: connections dropped{}",
        s.initiator,
        if wait_s > 0 {
            " (no logout in time)"
        } else {
            ""
        }
    );
    Ok(Dropped {
        tsih,
        outcome: DropOutcome::Dropped,
    })
}

/// Asks the target behind `path` one request and returns its answer (blocking; for the
/// command line). `timeout` bounds the wait for the answer.
pub fn request(path: &Path, r: &Request, timeout: Duration) -> anyhow::Result<Response> {
    use anyhow::Context;
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(path).with_context(|| {
        format!(
            "control socket {} (is the target running, with [control] socket or under \
             systemd, and may this user reach it?)",
            path.display()
        )
    })?;
    s.set_read_timeout(Some(timeout))?;
    // A target that refuses this user answers (and closes) before it reads the request:
    // its answer says why, which a failed write must not hide.
    let sent = s
        .write_all(&proto::encode(r))
        .and_then(|()| s.shutdown(std::net::Shutdown::Write));
    if let Err(e) = sent {
        if !matches!(
            e.kind(),
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
        ) {
            return Err(e).with_context(|| format!("writing to {}", path.display()));
        }
    }
    let mut out = Vec::new();
    s.take(proto::MAX_RESPONSE as u64 + 1)
        .read_to_end(&mut out)
        .with_context(|| format!("reading the answer of {}", path.display()))?;
    Ok(proto::parse_response(&out)?)
}
