//! Compiles the C++ shim that reads through librbd's C++ API into a `ceph::bufferlist`
//! (shim/read_bl.cc; Debian's libradospp-dev and librbd-dev give its headers).

fn main() {
    println!("cargo:rerun-if-changed=shim/read_bl.cc");
    // Without the `ceph` feature only the pure parsers build: nothing to compile or link.
    if std::env::var_os("CARGO_FEATURE_CEPH").is_none() {
        return;
    }
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .warnings(true)
        .file("shim/read_bl.cc")
        .compile("rsv_rbd_shim");
    // The shim calls librbd's and librados' C++ symbols (and the C++ runtime, which `cc`
    // links for a cpp build).
    println!("cargo:rustc-link-lib=rbd");
    println!("cargo:rustc-link-lib=rados");
}
