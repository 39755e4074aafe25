//! `rsv sync promote|demote|status|resync`: failover and failback of a replicated volume
//! (`crate::failover`, rules in `crate::role`).

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, FromArgMatches, Subcommand};

use crate::auth::Key;
use crate::coord::VolumeRef;
use crate::failover::{self, VolumeStatus};

#[derive(Subcommand, Debug)]
pub enum Action {
    /// Make VOLUME (a replica) primary and writable, at a new epoch past any it has seen.
    /// Refused while a sync is writing it, unless --force.
    #[command(after_help = "\
Every LUN of the volume (the file server's and each stripe member's) becomes primary.
Applications may write it at once. Run on the far site after the primary site is lost;
when the old primary comes back, demote it and resync it from this one.

First every stripe member's cycle state is asked, and the members are brought to one
image: a cycle committed on some members and prepared on the others (the sync's
coordinator lost between two members' commits) is committed on those (rolled forward);
an open cycle no member committed is rolled back on every member. Either needs --force,
and the refusal without it says which. Members that cannot be brought to one image (one
committed a cycle another neither prepared nor committed) refuse the promote, named,
even with --force.

Exit status: 0 promoted (or primary already), 1 refused or failed.")]
    Promote(PromoteArgs),
    /// Make VOLUME (the old primary) a replica: read-only to applications, written only
    /// by the resync that brings it back.
    #[command(after_help = "\
Every LUN of the volume becomes a replica; application writes get DATA PROTECT, WRITE
PROTECTED from then on, and a send of it still running stops. Its change map is kept:
the resync sends its own writes since the last common image back over.

Exit status: 0 demoted (or a replica already), 1 failed.")]
    Demote(VolumeArgs),
    /// Show VOLUME's role, epoch, last common image and what was written since.
    Status(VolumeArgs),
    /// Failback: send NEW_PRIMARY to OLD_PRIMARY (demoted), only the units that differ
    /// since the last image both hold: NEW_PRIMARY's changes and OLD_PRIMARY's own.
    #[command(after_help = "\
Both sides keep change tracking (track = true): the new primary's map holds what it wrote
since it was promoted, the old primary's what it wrote after the last completed sync
(writes that never reached the far site). Their union is sent, from one point-in-time cut
of NEW_PRIMARY, and verified by checksums; never a full copy. Refused when the two hold no
common image (then: rsv sync --full NEW_PRIMARY OLD_PRIMARY).

Exit status: 0 done and verified, 1 refused or failed (run it again to resume).")]
    Resync(ResyncArgs),
}

#[derive(Args, Debug)]
pub struct VolumeArgs {
    /// The volume: [rsv://]HOST[:PORT]/IQN/LUN.
    pub volume: VolumeRef,
    /// The key file every control request is signed with (owner-readable only).
    #[arg(long, env = "RSV_CONTROL_KEY", value_name = "FILE")]
    pub key_file: PathBuf,
    /// The result as one JSON line on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct PromoteArgs {
    #[command(flatten)]
    pub volume: VolumeArgs,
    /// Promote even while a sync's cycle is open on the volume: a cycle committed on some
    /// members and prepared on the others is committed on those; one no member committed
    /// is rolled back (the volume holds the last committed image).
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug)]
pub struct ResyncArgs {
    /// The primary now (promoted): [rsv://]HOST[:PORT]/IQN/LUN.
    pub new_primary: VolumeRef,
    /// The old primary, demoted: [rsv://]HOST[:PORT]/IQN/LUN.
    pub old_primary: VolumeRef,
    /// `--key-file FILE` (or RSV_CONTROL_KEY) and any option of `rsv sync` (--rate, --json,
    /// --session, --no-verify, --cut-hold...; see `rsv sync --help`), as for a sync.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "SYNC OPTIONS"
    )]
    pub options: Vec<String>,
}

fn print(s: &VolumeStatus, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(s)?);
        return Ok(());
    }
    let epoch = s
        .epoch
        .map(|e| format!(" at epoch {e}"))
        .unwrap_or_default();
    let image = match (&s.image, s.image_unix) {
        (Some(i), Some(t)) => format!("; last common image {i} (completed at {t}, Unix time)"),
        _ => "; no common image".into(),
    };
    let dirty = s
        .dirty_bytes
        .map(|b| format!("; {} written since", units::Size(b).approx()))
        .unwrap_or_default();
    println!("{}: {} {}{epoch}{image}{dirty}", s.volume, s.event, s.role);
    if let Some(b) = &s.busy {
        println!("  {b}");
    }
    if let Some(c) = s.rolled_forward {
        println!("  cycle {c} rolled forward: committed where it was prepared");
    }
    for m in &s.rolled_back {
        println!("  {m}: the open cycle rolled back");
    }
    Ok(())
}

pub fn run(action: Action) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    match action {
        Action::Promote(a) => {
            let key = Key::from_file(&a.volume.key_file)?;
            let s = rt.block_on(failover::promote(&a.volume.volume, &key, a.force))?;
            print(&s, a.volume.json)
        }
        Action::Demote(a) => {
            let key = Key::from_file(&a.key_file)?;
            let s = rt.block_on(failover::demote(&a.volume, &key))?;
            print(&s, a.json)
        }
        Action::Status(a) => {
            let key = Key::from_file(&a.key_file)?;
            let s = rt.block_on(failover::status(&a.volume, &key))?;
            print(&s, a.json)
        }
        Action::Resync(a) => {
            drop(rt);
            // The sync's own options, read as `rsv sync` reads them.
            let mut argv = vec![
                "sync".to_string(),
                show(&a.new_primary),
                show(&a.old_primary),
            ];
            argv.extend(a.options);
            let cmd = crate::cli::SyncArgs::augment_args(clap::Command::new("sync"));
            let m = cmd
                .try_get_matches_from(argv)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let args = crate::cli::SyncArgs::from_arg_matches(&m)?;
            crate::cli::run_sync(args, true)
        }
    }
}

fn show(v: &VolumeRef) -> String {
    crate::coord::shown_volume(v)
}
