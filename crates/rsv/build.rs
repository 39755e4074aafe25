//! The commit `rsv version` names: RSV_BUILD_COMMIT when the build sets it (a package
//! built from a tarball, where there is no repository), else the repository's HEAD, else
//! none. Rebuilt when HEAD, the branch or the index moves, wherever git keeps them (in a
//! linked worktree `.git` is a file; `build-support/commit.rs`, shared with the lab), so
//! the binary never names a commit it was not built at.

#[path = "../../build-support/commit.rs"]
mod commit;

fn main() {
    println!("cargo:rerun-if-env-changed=RSV_BUILD_COMMIT");
    let commit = std::env::var("RSV_BUILD_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| {
            let d = commit::dirs(std::path::Path::new(env!("CARGO_MANIFEST_DIR")))?;
            commit::rerun_if_changed(&d);
            commit::head(&d)
        });
    println!(
        "cargo:rustc-env=RSV_BUILD_COMMIT={}",
        commit.unwrap_or_default()
    );
}
