//! Every ```rust block of the workspace README and of each crate's README compiles.
//!
//! The coord-tests build script reads `README.md` and `<crate>/README.md` and writes each Rust
//! block into a module file of its own inside a small wrapper (`tests/readme/extract.rs`);
//! this test target declares every one of those modules, so the blocks are compiled with the
//! test targets, against this crate's dependencies and dev-dependencies (coord-core,
//! coord-redis, coord-http, axum, figment, ...) as they are already built for the other tests:
//! no build of its own (an earlier version had trybuild build a separate project, which
//! compiled every dependency a second time and was one of the slowest tests of the suite).
//! A block that stops compiling (an API renamed or moved, a method gone, a wrong type) fails
//! the build of this test; the compiler names the failing module file after the README and
//! the line of the block's fence (`README.md_line_301.rs`, `coord-redis_README.md_line_7.rs`),
//! and the block sits at the same line numbers in that file as in the README, so a compiler
//! message's line is the README's line. At run time the test checks that no fence was refused
//! and that the blocks compiled in are the blocks the READMEs hold now.
//!
//! The examples are compiled, never run: they connect to Redis, serve HTTP or stand for code
//! in an application. Each block is a module of its own, so the names one block declares never
//! meet another's; rustc's unused-code warnings and clippy are off inside them.
//!
//! # What a block may assume
//!
//! A block is shown to readers as it is, so it carries no hidden lines. What it takes for
//! granted comes from the context its fence names (GitHub and crates.io show every fence
//! below as Rust):
//!
//! * ```` ```rust ```` or ```` ```rust,no_run ````: the block is the body of an async function
//!   returning `Result<(), Box<dyn Error>>` (so `?` and `.await` work), whose parameters are
//!   the values the README's examples talk about: `coord` and `coordinator` (a
//!   `Coordinator`), `service` (a `Service` with an `#[idempotent]` `charge` method), `key`,
//!   `order`, `order_id`, `tenant_id`, `symbol`, `fingerprint` and `env`. Items (functions
//!   with attributes, `use` lines) are fine there too.
//! * ```` ```rust,methods ````: the block is the body of `impl Service`, for examples of
//!   attributes on methods taking `&self`; its `use` lines are moved to the module, and
//!   `Service` has the fields `payments`, `index` and `prices`.
//!
//! In both, `tests/readme/prelude.rs` (a module of the crate's root) is glob-imported: the application's own types and
//! functions the examples use (`Order`, `Receipt`, `PaymentError`, `Quote`, `fetch`,
//! `charge`, ...) and the coord names a reader expects without a `use` line (the four
//! attributes, `Coordinator`, `CoordConfig`, `Duration`, `Arc`). A name the block declares
//! itself wins over the prelude's.
//!
//! Any other word after `rust,` (`ignore`, `compile_fail`, a typo) fails the test: every
//! Rust block of a README must compile. A block that is not Rust (shell, TOML) is fenced as
//! such and skipped.
//!
//! One limit: `#[test]` functions a block declares (`conformance_suite!`) are compiled only
//! in test builds, so their bodies are not checked here; the macro's name and arguments are.

use std::path::Path;

// The prelude every block glob-imports, at this crate's root as the blocks expect.
#[allow(dead_code, unused_imports)]
#[path = "../readme/prelude.rs"]
mod prelude;

#[allow(dead_code)]
#[path = "../readme/extract.rs"]
mod extract;

use extract::{Context, block_name, rust_blocks, wrap};

// Every block's module, and the lists `REFUSED` and `COMPILED` (written by the build script).
include!(concat!(env!("OUT_DIR"), "/readme_examples.rs"));

#[test]
fn every_rust_fence_is_accepted() {
    assert!(
        REFUSED.is_empty(),
        "README code blocks:\n{}",
        REFUSED.join("\n")
    );
}

#[test]
fn the_blocks_compiled_in_are_the_readmes_blocks() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives inside the workspace");
    let (blocks, _) = extract::all_blocks(root);
    let now: Vec<String> = blocks.iter().map(block_name).collect();
    assert!(
        now.iter().any(|name| name.starts_with("README.md:")),
        "no ```rust block found in README.md: is the fence parsing broken?"
    );
    assert_eq!(
        COMPILED, now,
        "the README examples compiled into this test are not the READMEs' blocks of now: the \
         build script did not run again after a README changed (see its rerun-if-changed list)"
    );
}

#[test]
fn blocks_keep_their_readme_line_numbers() {
    let readme = "# Title\n\nText.\n\n```rust,methods\nuse a::b;\nfn f(&self) {}\n```\n\n\
                  ```sh\ncargo test\n```\n\n```rust\nlet x = 1;\n```\n";
    let mut refused = Vec::new();
    let blocks = rust_blocks("README.md", readme, &mut refused);
    assert!(refused.is_empty(), "{refused:?}");
    assert_eq!(blocks.len(), 2, "the sh block is skipped: {blocks:?}");

    assert_eq!(blocks[0].context, Context::Methods);
    let methods = wrap(&blocks[0]);
    let lines: Vec<&str> = methods.lines().collect();
    assert_eq!(
        lines[4], "impl Service {",
        "the opener sits on the fence's line"
    );
    assert_eq!(lines[5], "", "the use line moves out of the impl");
    assert_eq!(
        lines[6], "fn f(&self) {}",
        "README line 7 is the file's line 7"
    );
    assert!(lines.contains(&"use a::b;"));

    assert_eq!(blocks[1].fence_line, 14);
    assert_eq!(blocks[1].context, Context::Statements);
    let statements = wrap(&blocks[1]);
    assert_eq!(statements.lines().nth(14), Some("let x = 1;"));
}

#[test]
fn unknown_fence_words_are_refused() {
    let readme = "```rust,ignore\nfn f() {}\n```\n\n```rust,no_rnu\nfn g() {}\n```\n";
    let mut refused = Vec::new();
    rust_blocks("coord-x/README.md", readme, &mut refused);
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert!(
        refused[0].starts_with("coord-x/README.md:1: `ignore`"),
        "{refused:?}"
    );
    assert!(
        refused[1].starts_with("coord-x/README.md:5: `no_rnu`"),
        "{refused:?}"
    );
}
