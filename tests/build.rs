//! Writes every ```rust block of the READMEs as a module file into the build directory, and
//! the list of those modules that the `readme_examples` test includes: the README examples
//! are then compiled with the test targets, against the dependencies already built for them
//! (see `tests/tests/readme_examples.rs`).

use std::path::{Path, PathBuf};

#[path = "readme/extract.rs"]
#[allow(dead_code)]
mod extract;

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let root = manifest
        .parent()
        .expect("the tests crate lives inside the workspace")
        .to_owned();
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("set by cargo"));
    let dir = out.join("readme_examples");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("the build directory can be written");

    let (blocks, refused) = extract::all_blocks(&root);
    for block in &blocks {
        std::fs::write(dir.join(extract::file_name(block)), extract::wrap(block))
            .expect("an example file can be written");
    }
    std::fs::write(
        out.join("readme_examples.rs"),
        extract::module_list(&blocks, &refused, &dir),
    )
    .expect("the module list can be written");

    // Again when a README changes, or the workspace's member list (a crate added or removed
    // may add or remove a README).
    for readme in extract::readmes(&root) {
        rerun_if_changed(&root.join(readme));
    }
    rerun_if_changed(&root.join("Cargo.toml"));
    rerun_if_changed(&manifest.join("readme/extract.rs"));
}

fn rerun_if_changed(path: &Path) {
    println!("cargo:rerun-if-changed={}", path.display());
}
