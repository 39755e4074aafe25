//! Records which commit `rsv-lab` is built from, for the lab's results: the checkout may
//! have moved on by the time a long run writes them. `-dirty` when the sources the
//! binary is built from differ from that commit; rerun when HEAD, the index, the branch or
//! those sources change, wherever git keeps them (a linked worktree's `.git` is a file).

#[path = "../build-support/commit.rs"]
mod commit;

fn main() {
    let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let label = match commit::dirs(here) {
        Some(d) => {
            commit::rerun_if_changed(&d);
            match commit::head(&d) {
                Some(c) => commit::label(&c, commit::dirty(&d)),
                None => "unknown".into(),
            }
        }
        None => "unknown".into(),
    };
    println!("cargo:rustc-env=RSV_BUILD_COMMIT={label}");
}
