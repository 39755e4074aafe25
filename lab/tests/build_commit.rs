//! The build scripts' record of the commit (`build-support/commit.rs`, shared by
//! `lab/build.rs` and `crates/rsv/build.rs`), in a repository made here with a linked
//! worktree, as `git worktree add` makes them: a worktree's `.git` is a file, its HEAD and
//! index are elsewhere, and the label must follow a commit, an edit and its revert there.

#[path = "../../build-support/commit.rs"]
mod commit;

use std::path::Path;
use std::process::Command;

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@example.org"])
        .args(args)
        .output()
        .expect("git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_linked_worktree_is_watched_where_git_keeps_it() {
    let tmp = tempfile::tempdir().unwrap();
    let main = tmp.path().join("main");
    std::fs::create_dir_all(main.join("crates/a")).unwrap();
    std::fs::write(main.join("crates/a/lib.rs"), "// one\n").unwrap();
    std::fs::write(main.join("README"), "docs\n").unwrap();
    git(&main, &["init", "-q", "-b", "main"]);
    git(&main, &["add", "."]);
    git(&main, &["commit", "-q", "-m", "one"]);
    let wt = tmp.path().join("wt");
    git(
        &main,
        &["worktree", "add", "-q", "-b", "topic", wt.to_str().unwrap()],
    );
    assert!(
        wt.join(".git").is_file(),
        "a linked worktree's .git is a file"
    );

    let d = commit::dirs(&wt.join("crates/a")).expect("inside a checkout");
    let main = main.canonicalize().unwrap();
    assert_eq!(d.top, wt.canonicalize().unwrap());
    assert_eq!(d.git_dir, main.join(".git/worktrees/wt"));
    assert_eq!(d.common_dir, main.join(".git"));
    assert_eq!(d.branch.as_deref(), Some("refs/heads/topic"));
    let watched = commit::watched(&d);
    for p in [
        main.join(".git/worktrees/wt/HEAD"),
        main.join(".git/worktrees/wt/index"),
        main.join(".git/refs/heads/topic"),
        d.top.join("crates"),
    ] {
        assert!(watched.contains(&p), "{p:?} not in {watched:?}");
    }
    assert!(
        watched.iter().all(|p| p.exists()),
        "only paths that exist: {watched:?}"
    );

    // Clean, then an edit of a source, then its revert: the label follows.
    let one = commit::head(&d).unwrap();
    assert!(!commit::dirty(&d));
    std::fs::write(wt.join("crates/a/lib.rs"), "// two\n").unwrap();
    assert!(commit::dirty(&d));
    assert_eq!(commit::label(&one, true), format!("{}-dirty", &one[..7]));
    // An edit outside the sources (documents) does not change the build.
    git(&wt, &["checkout", "--", "crates/a/lib.rs"]);
    std::fs::write(wt.join("README"), "more docs\n").unwrap();
    assert!(!commit::dirty(&d));
    // A commit in the worktree moves HEAD there, not in the main checkout.
    git(&wt, &["commit", "-q", "-am", "two"]);
    let two = commit::head(&d).unwrap();
    assert_ne!(one, two);
    assert_eq!(commit::label(&two, false), two[..7]);
    let main_d = commit::dirs(&main).unwrap();
    assert_eq!(commit::head(&main_d).unwrap(), one);
    assert_eq!(main_d.git_dir, main.join(".git"));
}
