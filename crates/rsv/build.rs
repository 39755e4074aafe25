//! The commit `rsv version` names: RSV_BUILD_COMMIT when the build sets it (a package
//! built from a tarball, where there is no repository), else the repository's HEAD, else
//! none. Rebuilt when HEAD moves, so the binary never names a commit it was not built at.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=RSV_BUILD_COMMIT");
    let commit = std::env::var("RSV_BUILD_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| {
            // HEAD, and the branch it points to (loose or packed), decide the commit: in a
            // worktree HEAD is in its own directory and the branches in the common one.
            // Only files that exist: cargo runs a script again on every build for a path
            // that does not.
            let branch = git(&["symbolic-ref", "-q", "HEAD"]);
            for dir in [
                git(&["rev-parse", "--git-dir"]),
                git(&["rev-parse", "--git-common-dir"]),
            ]
            .into_iter()
            .flatten()
            {
                let dir = Path::new(&dir);
                let files = ["HEAD", "packed-refs"].into_iter().chain(branch.as_deref());
                for f in files.map(|f| dir.join(f)).filter(|f| f.exists()) {
                    println!("cargo:rerun-if-changed={}", f.display());
                }
            }
            git(&["rev-parse", "HEAD"])
        });
    println!(
        "cargo:rustc-env=RSV_BUILD_COMMIT={}",
        commit.unwrap_or_default()
    );
}
