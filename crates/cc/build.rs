//! Compiles `bpf/rsv.bpf.c` to a BPF object with clang (`-target bpf -O2 -g`), which the
//! library embeds. The types it uses come from `bpf/kernel.h` (checked in, CO-RE: libbpf
//! moves every field to the running kernel's offsets at load time), the helper macros from
//! libbpf-dev's `<bpf/bpf_helpers.h>`. Without clang or those headers the build still
//! succeeds: the object is empty and `rsv_cc::load` answers "not built" with the reason.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").unwrap()).join("rsv.bpf.o");
    println!("cargo:rerun-if-changed=bpf/rsv.bpf.c");
    println!("cargo:rerun-if-changed=bpf/kernel.h");
    println!("cargo:rerun-if-env-changed=RSV_CLANG");
    println!("cargo:rerun-if-env-changed=RSV_CC_NAME");
    println!("cargo:rerun-if-env-changed=CARGO_FEATURE_BPF");
    let name = cc_name();
    println!("cargo:rustc-env=RSV_CC_NAME={name}");
    let wanted = env::var_os("CARGO_FEATURE_BPF").is_some();
    let built = if wanted {
        build(&out, &name)
    } else {
        Err("built without the bpf feature".into())
    };
    match built {
        Ok(()) => println!("cargo:rustc-env=RSV_CC_NOT_BUILT="),
        Err(why) => {
            std::fs::write(&out, b"").unwrap();
            if wanted {
                println!("cargo:warning=rsv congestion control not built: {why}");
            }
            println!("cargo:rustc-env=RSV_CC_NOT_BUILT={why}");
            // Installing clang or libbpf-dev later (scripts/setup.sh) changes /usr/bin or
            // /usr/include: build again then.
            println!("cargo:rerun-if-changed=/usr/bin");
            println!("cargo:rerun-if-changed=/usr/include");
        }
    }
}

/// The name the program registers under: `rsv`, or `RSV_CC_NAME` at build time. Another
/// name lets a build run beside another build's `rsv` on one host (only the first process to
/// register a name runs its program; the others' sockets run that one), so that two
/// versions of the program can be measured side by side.
fn cc_name() -> String {
    let name = env::var("RSV_CC_NAME").unwrap_or_else(|_| "rsv".into());
    // The kernel's TCP_CA_NAME_MAX is 16 with the NUL.
    let ok = !name.is_empty()
        && name.len() <= 15
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    assert!(
        ok,
        "RSV_CC_NAME={name:?}: 1 to 15 of a-z, 0-9 and _ (a congestion control's name)"
    );
    name
}

fn build(out: &Path, name: &str) -> Result<(), String> {
    let clang = find_clang().ok_or("no clang (RSV_CLANG, clang-14 or clang; Debian: clang-14)")?;
    println!("cargo:rerun-if-changed={}", clang.display());
    if !Path::new("/usr/include/bpf/bpf_helpers.h").exists() {
        return Err("no <bpf/bpf_helpers.h> (Debian: libbpf-dev)".into());
    }
    let arch = match env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("x86_64") => "x86",
        Ok("aarch64") => "arm64",
        Ok(other) => return Err(format!("no BPF build for target arch {other}")),
        Err(_) => return Err("CARGO_CFG_TARGET_ARCH unset".into()),
    };
    let output = Command::new(&clang)
        .args(["-target", "bpf", "-O2", "-g", "-Wall", "-Werror"])
        .arg(format!("-D__TARGET_ARCH_{arch}"))
        .arg(format!("-DRSV_CC_NAME=\"{name}\""))
        .args(["-c", "bpf/rsv.bpf.c", "-o"])
        .arg(out)
        .output()
        .map_err(|e| format!("{}: {e}", clang.display()))?;
    if !output.status.success() {
        let err = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = err.lines().rev().take(5).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(format!("{} failed: {}", clang.display(), tail.join(" | ")));
    }
    Ok(())
}

fn find_clang() -> Option<PathBuf> {
    if let Some(p) = env::var_os("RSV_CLANG") {
        return Some(PathBuf::from(p));
    }
    let path = env::var_os("PATH")?;
    for name in ["clang-14", "clang"] {
        for dir in env::split_paths(&path) {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}
