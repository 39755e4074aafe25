//! A replicated LUN's role, kept durably beside its data (the store's `.role` sidecar):
//! primary or replica, the epoch it holds, the last image both sites hold, and, for a
//! replica, the initiators that may write it (its replication streams). `rsv sync`
//! decides what a role allows (`replicate::role`); the target reads the file when it
//! opens the LUN, so a replica comes back fenced after a restart.
//!
//! The file is text, one `key value` a line, written whole: `PATH.tmp`, fsync, rename
//! over `PATH`, fsync the directory. A crash leaves the old file or the new one.
//! ```text
//! rsv-role 1
//! role replica
//! epoch 3
//! image 8463021 1764412800
//! writer iqn.2026-01.org.reservoir:sync.4f1c...
//! ```
//! A source's LUN may also hold `pending ID UNIX`: the image a completed transfer was
//! about to record on both sides when it was last written (see [`RoleRecord::pending`]).

use std::fs::{File, OpenOptions};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

const MAGIC: &str = "rsv-role 1";

/// Primary (applications write it, it is the source of syncs) or replica (read-only to
/// applications, written by the replication streams).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Primary,
    Replica,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Primary => "primary",
            Role::Replica => "replica",
        }
    }
}

/// The last image both sites hold: the sync that completed last between them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ImageMark {
    /// The sync's id (its cut's).
    pub id: u64,
    /// When it completed (Unix seconds).
    pub unix: u64,
}

/// What the `.role` file holds.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RoleRecord {
    pub role: Role,
    /// Grows at every promote; a site's data belongs to the epoch it holds.
    pub epoch: u64,
    pub image: Option<ImageMark>,
    /// On a source: the image a completed transfer records next, written here before the
    /// far side records it and cleared when this side does. A failure between the two
    /// leaves the far side at `pending` and this side at `image`; a resync then knows the
    /// far side's image is one this side also holds (`replicate::role::check_transfer`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<ImageMark>,
    /// A replica's writers (initiator names); empty for a primary.
    pub writers: Vec<String>,
}

/// What a replica's writer appends to its name to say which cycle its stream writes.
const CYCLE_TAG: &str = ".cycle-";

/// The initiator name a replication stream of cycle `cycle` logs in with: its replica's
/// writer name, tagged with the cycle. A replica that keeps cycles (an undo log) admits
/// the stream's writes only while that cycle is open there (`scsi::Fence`), so a stream
/// left running after its cycle was rolled back or committed changes nothing.
pub fn cycle_writer(writer: &str, cycle: u64) -> String {
    format!("{writer}{CYCLE_TAG}{cycle:016x}")
}

/// An initiator name as [`cycle_writer`] makes it: the writer's name and the cycle; a
/// name with no (well-formed) tag is the writer's name alone.
pub fn writer_and_cycle(name: &str) -> (&str, Option<u64>) {
    if let Some(at) = name.rfind(CYCLE_TAG) {
        let hex = &name[at + CYCLE_TAG.len()..];
        if hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            if let Ok(c) = u64::from_str_radix(hex, 16) {
                return (&name[..at], Some(c));
            }
        }
    }
    (name, None)
}

impl RoleRecord {
    /// Who may change the LUN's medium under this role: everyone on a primary, only the
    /// writers on a replica.
    pub fn fence(&self) -> Option<Vec<String>> {
        match self.role {
            Role::Primary => None,
            Role::Replica => Some(self.writers.clone()),
        }
    }

    pub fn encode(&self) -> String {
        let mut s = format!(
            "{MAGIC}\nrole {}\nepoch {}\n",
            self.role.as_str(),
            self.epoch
        );
        if let Some(i) = self.image {
            s += &format!("image {} {}\n", i.id, i.unix);
        }
        if let Some(i) = self.pending {
            s += &format!("pending {} {}\n", i.id, i.unix);
        }
        for w in &self.writers {
            s += &format!("writer {w}\n");
        }
        s
    }

    /// Reads the text of a `.role` file; `Err` says what is wrong with it.
    pub fn decode(text: &str) -> Result<RoleRecord, String> {
        let mut lines = text.lines();
        if lines.next() != Some(MAGIC) {
            return Err(format!("does not start with {MAGIC:?}"));
        }
        let (mut role, mut epoch, mut image, mut pending, mut writers) =
            (None, None, None, None, Vec::new());
        for (n, line) in lines.enumerate() {
            let bad = |why: &str| format!("line {}: {why}: {line:?}", n + 2);
            let (key, value) = line.split_once(' ').ok_or_else(|| bad("no value"))?;
            match key {
                "role" => {
                    role = Some(match value {
                        "primary" => Role::Primary,
                        "replica" => Role::Replica,
                        _ => return Err(bad("unknown role")),
                    })
                }
                "epoch" => epoch = Some(value.parse().map_err(|_| bad("bad epoch"))?),
                "image" | "pending" => {
                    let (id, unix) = value.split_once(' ').ok_or_else(|| bad("image ID UNIX"))?;
                    let mark = Some(ImageMark {
                        id: id.parse().map_err(|_| bad("bad image id"))?,
                        unix: unix.parse().map_err(|_| bad("bad image time"))?,
                    });
                    if key == "image" {
                        image = mark;
                    } else {
                        pending = mark;
                    }
                }
                "writer" if !value.is_empty() && !value.contains(char::is_whitespace) => {
                    writers.push(value.to_owned())
                }
                _ => return Err(bad("unknown line")),
            }
        }
        Ok(RoleRecord {
            role: role.ok_or("no role line")?,
            epoch: epoch.ok_or("no epoch line")?,
            image,
            pending,
            writers,
        })
    }

    /// The record at `path`; `None` when there is no file (a LUN that was never
    /// replicated). A file that cannot be read as a record is an error: a replica must
    /// not come back writable because its record was damaged.
    pub fn load(path: &Path) -> io::Result<Option<RoleRecord>> {
        match std::fs::read_to_string(path) {
            Ok(text) => RoleRecord::decode(&text).map(Some).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: {e}", path.display()),
                )
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
        }
    }

    /// Writes the record to `path` crash-safely (see the module documentation).
    pub fn store(&self, path: &Path) -> io::Result<()> {
        let named = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
        let tmp = tmp_path(path);
        let written = (|| {
            // The data directory of a target whose LUNs keep nothing there (a stripe over
            // disk servers) may not exist yet.
            if let Some(d) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(d)?;
            }
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)?;
            f.write_all(self.encode().as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(named(e));
        }
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        File::open(dir).and_then(|d| d.sync_all()).map_err(named)
    }
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".tmp");
    PathBuf::from(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_and_a_damaged_one_is_refused() {
        let dir = std::env::temp_dir().join(format!("rsv-role-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("disk.img.role");
        assert_eq!(RoleRecord::load(&path).unwrap(), None);
        let r = RoleRecord {
            role: Role::Replica,
            epoch: 3,
            image: Some(ImageMark {
                id: 77,
                unix: 1_764_412_800,
            }),
            pending: Some(ImageMark {
                id: 78,
                unix: 1_764_412_805,
            }),
            writers: vec!["iqn.2026-01.org.reservoir:sync.ab".into()],
        };
        r.store(&path).unwrap();
        assert_eq!(RoleRecord::load(&path).unwrap(), Some(r.clone()));
        assert!(!tmp_path(&path).exists());
        assert_eq!(r.fence(), Some(r.writers.clone()));
        std::fs::write(&path, "rsv-role 1\nrole replica\n").unwrap();
        assert!(RoleRecord::load(&path).is_err(), "no epoch");
        std::fs::write(&path, "rsv-role 1\nrole boss\nepoch 1\n").unwrap();
        assert!(RoleRecord::load(&path).is_err());
        std::fs::write(&path, "garbage").unwrap();
        assert!(RoleRecord::load(&path).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_cycle_writer_name_reads_back() {
        let w = "iqn.2026-01.org.reservoir:sync.00ab";
        let n = cycle_writer(w, 0xdead_beef);
        assert_eq!(
            n,
            "iqn.2026-01.org.reservoir:sync.00ab.cycle-00000000deadbeef"
        );
        assert_eq!(writer_and_cycle(&n), (w, Some(0xdead_beef)));
        assert_eq!(writer_and_cycle(w), (w, None));
        // Only a whole tag counts: anything else is a name of its own.
        for odd in [
            "iqn.x:sync.1.cycle-12",
            "iqn.x:sync.1.cycle-00000000deadbeeg",
            "iqn.x:sync.1.cycle-00000000deadbeef0",
            ".cycle-",
        ] {
            assert_eq!(writer_and_cycle(odd), (odd, None), "{odd}");
        }
    }
}
