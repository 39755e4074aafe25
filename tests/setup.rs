//! The fresh-machine set-up (`scripts/setup.sh`): its choice of a qemu-utils /
//! qemu-block-extra pair against fake package databases, and, on this machine, that a run
//! finds every tool working and installs nothing.

use std::path::{Path, PathBuf};
use std::process::Command;

use testkit::output::ok_stdout;

fn setup_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/setup.sh")
}

/// A fake `apt-cache madison` and `dpkg-query -W` answering from the given versions.
struct FakeApt {
    dir: tempfile::TempDir,
}

impl FakeApt {
    fn new(installed_utils: Option<&str>, repo_utils: &[&str], repo_block: &[&str]) -> FakeApt {
        let dir = tempfile::tempdir().unwrap();
        let madison = |pkg: &str, versions: &[&str]| {
            versions
                .iter()
                .map(|v| format!("echo '{pkg:>16} | {v} | http://deb.example/debian bookworm/main amd64 Packages'\n"))
                .collect::<String>()
        };
        let apt_cache = format!(
            "#!/bin/sh\n[ \"$1\" = madison ] || exit 1\ncase \"$2\" in\nqemu-utils)\n{}\n;;\nqemu-block-extra)\n{}\n;;\nesac\n",
            madison("qemu-utils", repo_utils),
            madison("qemu-block-extra", repo_block),
        );
        let dpkg_query = match installed_utils {
            Some(v) => format!("#!/bin/sh\nprintf '%s' '{v}'\n"),
            None => {
                "#!/bin/sh\necho 'dpkg-query: no packages found matching qemu-utils' >&2\nexit 1\n"
                    .into()
            }
        };
        for (name, body) in [("apt-cache", apt_cache), ("dpkg-query", dpkg_query)] {
            let p = dir.path().join(name);
            std::fs::write(&p, body).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        FakeApt { dir }
    }

    /// What the script's `qemu_pair_version` picks with these package databases.
    fn pair_version(&self) -> String {
        let path = format!(
            "{}:{}",
            self.dir.path().display(),
            std::env::var("PATH").unwrap()
        );
        ok_stdout(
            Command::new("bash")
                .arg("-c")
                .arg(format!(
                    "source '{}' && qemu_pair_version",
                    setup_script().display()
                ))
                .env("PATH", path),
        )
        .trim()
        .to_string()
    }
}

const BPO: &str = "1:10.0.2+ds-2+deb13u1~bpo12+1";
const MAIN: &str = "1:7.2+dfsg-7+deb12u18+b3";
const SECURITY: &str = "1:7.2+dfsg-7+deb12u15";

#[test]
fn a_backported_qemu_utils_without_its_module_is_paired_with_the_newest_matching_version() {
    // The image of this project's machines: qemu-utils 1:10 from a local package, the
    // module only at 1:7.2. Installing the two unversioned is what failed.
    let apt = FakeApt::new(Some(BPO), &[MAIN, SECURITY], &[SECURITY, MAIN]);
    assert_eq!(apt.pair_version(), MAIN);
}

#[test]
fn an_installed_qemu_utils_with_a_matching_module_is_kept() {
    let apt = FakeApt::new(Some(SECURITY), &[MAIN, SECURITY], &[MAIN, SECURITY]);
    assert_eq!(apt.pair_version(), SECURITY);
}

#[test]
fn a_plain_debian_machine_gets_the_newest_pair() {
    let apt = FakeApt::new(None, &[SECURITY, MAIN], &[MAIN, SECURITY]);
    assert_eq!(apt.pair_version(), MAIN);
}

#[test]
fn no_version_offered_for_both_packages_gives_none() {
    let apt = FakeApt::new(Some(BPO), &[MAIN], &[SECURITY]);
    assert_eq!(apt.pair_version(), "");
}

#[test]
fn a_second_run_finds_everything_working_and_installs_nothing() {
    let out = Command::new(setup_script())
        .arg("--check")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        if std::env::var_os("CI").is_some() || std::env::var_os("RESERVOIR_TEST_STRICT").is_some() {
            panic!("scripts/setup.sh --check failed after the set-up ran:\n{stderr}");
        }
        eprintln!("SKIP: this machine lacks tools (run scripts/setup.sh as root):\n{stderr}");
        return;
    }
    assert!(
        stderr.contains("present and working; nothing to install"),
        "{stderr}"
    );
    assert!(!stderr.contains("installing"), "{stderr}");
}
