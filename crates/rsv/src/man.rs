//! `rsv man DIR`: manual pages generated from the same clap definitions as `--help`, so
//! that they cannot drift from it: rsv(1) and one page per subcommand, rsv-target(1) and
//! so on, as git names its pages (rsv-sync-promote(1) for a subcommand's own). The Debian package's build writes them (debian/rules);
//! the subcommand is hidden from `--help`.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// Writes rsv.1 and an rsv-SUBCOMMAND.1 per subcommand into `dir` (made if
/// missing); returns the files written.
pub fn write(mut cmd: clap::Command, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("{}", dir.display()))?;
    // Built, every subcommand knows its full command line ("rsv target") for its synopsis.
    cmd.build();
    let mut written = vec![page(&cmd, "rsv", dir)?];
    // Not clap's own `help` subcommand: `rsv help X` is `rsv X --help`, in rsv-X(1).
    let subs = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help");
    for sub in subs {
        written.push(page(sub, &format!("rsv-{}", sub.get_name()), dir)?);
        // A subcommand's own subcommands (`rsv sync promote`) get theirs:
        // rsv-sync-promote(1).
        for inner in sub
            .get_subcommands()
            .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        {
            let title = format!("rsv-{}-{}", sub.get_name(), inner.get_name());
            written.push(page(inner, &title, dir)?);
        }
    }
    Ok(written)
}

fn page(cmd: &clap::Command, title: &str, dir: &Path) -> anyhow::Result<PathBuf> {
    let path = dir.join(format!("{title}.1"));
    let mut text = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .title(title)
        .section("1")
        .source(format!("Reservoir {}", env!("CARGO_PKG_VERSION")))
        .manual("Reservoir")
        .render(&mut text)
        .with_context(|| title.to_owned())?;
    std::fs::write(&path, text).with_context(|| format!("{}", path.display()))?;
    Ok(path)
}
