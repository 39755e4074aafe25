//! Which commit a build is from, for the build scripts that record it (`crates/rsv/build.rs`
//! for `rsv version`, `lab/build.rs` for the lab's results), included by both with
//! `#[path]` so that they agree. Plain `std`: a build script has no dependencies here.
//!
//! The repository is asked where its files are (`git rev-parse --git-dir`,
//! `--git-common-dir`): in a linked worktree `.git` is a file, HEAD and the index live in
//! `.git/worktrees/NAME/` of the main checkout and the branches in its common directory,
//! so a script that watched `../.git/HEAD` and `../.git/index` watched nothing there and
//! kept a stale commit or `-dirty` label.

#![allow(dead_code)] // each script uses part of it

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where a checkout's git files are, as git says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GitDirs {
    /// The checkout's top directory.
    pub top: PathBuf,
    /// Its own git directory: HEAD and the index (`.git`, or `.git/worktrees/NAME`).
    pub git_dir: PathBuf,
    /// The repository's shared one: refs and packed-refs.
    pub common_dir: PathBuf,
    /// The ref HEAD points to (`refs/heads/main`); `None`: a detached HEAD.
    pub branch: Option<String>,
}

/// Sources whose change makes the build another build: what a `-dirty` label looks at,
/// relative to the checkout's top.
pub const SOURCES: [&str; 9] = [
    "Cargo.toml",
    "Cargo.lock",
    "crates",
    "build-support",
    "lab/Cargo.toml",
    "lab/build.rs",
    "lab/src",
    "lab/wan",
    "lab/timing",
];

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!s.is_empty()).then_some(s)
}

/// The git directories of the checkout holding `dir`; `None` outside one (a tarball).
pub fn dirs(dir: &Path) -> Option<GitDirs> {
    let out = git(
        dir,
        &[
            "rev-parse",
            "--path-format=absolute",
            "--show-toplevel",
            "--git-dir",
            "--git-common-dir",
        ],
    )?;
    let mut lines = out.lines().map(PathBuf::from);
    Some(GitDirs {
        top: lines.next()?,
        git_dir: lines.next()?,
        common_dir: lines.next()?,
        branch: git(dir, &["symbolic-ref", "-q", "HEAD"]),
    })
}

/// The files whose change may change the commit or the label: HEAD and the index in the
/// checkout's own git directory, the branch's ref (loose) and packed-refs in the common
/// one, and the sources. Only paths that exist: cargo reruns a script on every build for
/// one that does not.
pub fn watched(d: &GitDirs) -> Vec<PathBuf> {
    let mut v = vec![d.git_dir.join("HEAD"), d.git_dir.join("index")];
    v.push(d.common_dir.join("packed-refs"));
    if let Some(b) = &d.branch {
        v.push(d.common_dir.join(b));
    }
    v.extend(SOURCES.iter().map(|s| d.top.join(s)));
    v.retain(|p| p.exists());
    v
}

/// The commit HEAD is at (full hash).
pub fn head(d: &GitDirs) -> Option<String> {
    git(&d.top, &["rev-parse", "HEAD"])
}

/// Whether a tracked source differs from HEAD (staged or not).
pub fn dirty(d: &GitDirs) -> bool {
    let mut args = vec!["status", "--porcelain", "--untracked-files=no", "--"];
    args.extend(SOURCES);
    git(&d.top, &args).is_some()
}

/// The label a build records: the short commit, `-dirty` when its sources are not it.
pub fn label(commit: &str, dirty: bool) -> String {
    let short = &commit[..commit.len().min(7)];
    if dirty {
        format!("{short}-dirty")
    } else {
        short.to_owned()
    }
}

/// Prints `cargo:rerun-if-changed` for every file [`watched`] returns.
pub fn rerun_if_changed(d: &GitDirs) {
    for p in watched(d) {
        println!("cargo:rerun-if-changed={}", p.display());
    }
}
