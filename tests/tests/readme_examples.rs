//! Every ```rust block of the workspace README and of each crate's README compiles.
//!
//! The test reads `README.md` and `<crate>/README.md`, writes each Rust block into a module
//! file of its own inside a small wrapper, and has trybuild compile all of them as one crate
//! (one `pass` case whose root declares every block's module) against this crate's
//! dependencies and dev-dependencies (coord-core, coord-redis, coord-http, axum, figment, ...),
//! then run it. One crate, so one compile and one link for every block rather than one per
//! block (that was most of this test's time). A block that stops compiling (an API renamed or
//! moved, a method gone, a wrong type) fails the test; the compiler names the failing module
//! file after the README and the line of the block's fence (`README.md_line_301.rs`,
//! `coord-redis_README.md_line_7.rs`), and the block sits at the same line numbers in that file
//! as in the README, so a compiler message's line is the README's line.
//!
//! The examples are compiled, never run (the crate's `main` is empty): they connect to Redis,
//! serve HTTP or stand for code in an application. Each block is a module of its own, so the
//! names one block declares never meet another's.
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

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

// Compiled here as well as in every example file, so that `cargo fmt`, clippy and a plain
// `cargo test` see the prelude; the examples use most of it, this file none.
#[allow(dead_code, unused_imports)]
#[path = "../readme/prelude.rs"]
mod prelude;

/// How a block is wrapped, from the words after `rust` on its fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Context {
    /// The body of an async function with the examples' values as parameters.
    Statements,
    /// The body of `impl Service`.
    Methods,
}

/// One ```rust block of one README.
#[derive(Debug)]
struct Block {
    /// The README, relative to the workspace root (`README.md`, `coord-redis/README.md`).
    readme: String,
    /// The 1-based line of the opening fence.
    fence_line: usize,
    context: Context,
    /// The block's lines, without the fences (and without the fence's indentation).
    lines: Vec<String>,
}

/// The opening line of the statement context: one line, so that the block keeps its README
/// line numbers.
const STATEMENTS_OPEN: &str = "async fn readme_example(coord: Coordinator, \
    coordinator: Coordinator, service: Service, key: String, order: Order, order_id: String, \
    tenant_id: TenantId, symbol: &'static str, fingerprint: Fingerprint, env: &str) \
    -> Result<(), Box<dyn std::error::Error>> {";

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives inside the workspace")
        .to_owned()
}

/// `README.md` at the root, then each workspace directory's `README.md`, by name.
fn readmes(root: &Path) -> Vec<String> {
    let mut crates: Vec<String> = fs::read_dir(root)
        .expect("the workspace root is readable")
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.path())
        .filter(|dir| dir.join("Cargo.toml").is_file() && dir.join("README.md").is_file())
        .filter_map(|dir| Some(dir.file_name()?.to_str()?.to_owned()))
        .map(|name| format!("{name}/README.md"))
        .collect();
    crates.sort();
    let mut all = vec!["README.md".to_owned()];
    all.extend(crates);
    all
}

/// The Rust blocks of one README, or a message per fence this test does not accept.
fn rust_blocks(readme: &str, text: &str, refused: &mut Vec<String>) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((index, line)) = lines.next() {
        let trimmed = line.trim_start();
        let Some(info) = trimmed.strip_prefix("```") else {
            continue;
        };
        let indent = line.len() - trimmed.len();
        let fence_line = index + 1;
        let mut body = Vec::new();
        let mut closed = false;
        for (_, inner) in lines.by_ref() {
            if inner.trim() == "```" {
                closed = true;
                break;
            }
            let cut = inner.len() - inner.trim_start().len();
            body.push(inner[cut.min(indent)..].to_owned());
        }
        if !closed {
            refused.push(format!(
                "{readme}:{fence_line}: a code block that is never closed"
            ));
        }
        let mut words = info.trim().split(',').map(str::trim);
        if !matches!(words.next(), Some("rust" | "rs")) {
            continue;
        }
        let mut context = Context::Statements;
        for word in words {
            match word {
                "no_run" => {}
                "methods" => context = Context::Methods,
                other => refused.push(format!(
                    "{readme}:{fence_line}: `{other}` on a rust fence: every README example must \
                     compile; use `rust`, `rust,no_run` or `rust,methods` (see this test's docs)"
                )),
            }
        }
        blocks.push(Block {
            readme: readme.to_owned(),
            fence_line,
            context,
            lines: body,
        });
    }
    blocks
}

/// The module file for `block`: the block at its README line numbers, in its context, with
/// the prelude glob-imported.
fn wrap(block: &Block) -> String {
    let mut file = format!(
        "#![allow(unused, dead_code)] // {}, the rust block at line {} (written by the \
         readme_examples test: edit the README, not this file)\n",
        block.readme, block.fence_line
    );
    // Blank lines up to the fence, so that the block's lines keep their numbers.
    let mut line = 2;
    while line < block.fence_line {
        file.push('\n');
        line += 1;
    }
    let mut moved_uses = Vec::new();
    match block.context {
        Context::Statements => {
            file.push_str(STATEMENTS_OPEN);
            file.push('\n');
            for text in &block.lines {
                file.push_str(text);
                file.push('\n');
            }
            file.push_str("Ok(())\n}\n");
        }
        Context::Methods => {
            file.push_str("impl Service {\n");
            let mut in_use = false;
            for text in &block.lines {
                if in_use || text.trim_start().starts_with("use ") {
                    in_use = !text.trim_end().ends_with(';');
                    moved_uses.push(text.clone());
                    file.push('\n');
                } else {
                    file.push_str(text);
                    file.push('\n');
                }
            }
            file.push_str("}\n");
            file.push_str(
                "struct Service { payments: PaymentGateway, index: SearchIndex, prices: PriceFeed }\n",
            );
        }
    }
    for text in moved_uses {
        file.push_str(&text);
        file.push('\n');
    }
    file.push_str("#[allow(unused_imports)]\nuse crate::prelude::*;\n");
    file
}

/// The crate's root: the prelude and every block's module, declared by file name.
fn crate_root(blocks: &[Block], prelude: &Path) -> String {
    let prelude = prelude.to_str().expect("the workspace path is UTF-8");
    let mut root = format!(
        "// Every rust block of the READMEs, one module each (written by the readme_examples \
         test: edit the READMEs, not this file).\n#![allow(unused, dead_code)]\n\n\
         #[path = {prelude:?}]\nmod prelude;\n\n"
    );
    for block in blocks {
        let _ = writeln!(
            root,
            "#[path = {:?}]\nmod {};",
            file_name(block),
            module_name(block)
        );
    }
    root.push_str("\nfn main() {}\n");
    root
}

/// The module name for `block`, unique as its file name is: `coord_redis_readme_md_line_7`.
fn module_name(block: &Block) -> String {
    format!("{}_line_{}", block.readme, block.fence_line)
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// The file name that says which README and which block: `coord-redis_README.md_line_7.rs`.
fn file_name(block: &Block) -> String {
    format!(
        "{}_line_{}.rs",
        block.readme.replace('/', "_"),
        block.fence_line
    )
}

#[test]
fn readme_rust_blocks_compile() {
    let root = workspace_root();
    let mut refused = Vec::new();
    let mut blocks = Vec::new();
    for readme in readmes(&root) {
        let text = fs::read_to_string(root.join(&readme)).expect("a README is readable");
        blocks.extend(rust_blocks(&readme, &text, &mut refused));
    }
    assert!(
        refused.is_empty(),
        "README code blocks:\n{}",
        refused.join("\n")
    );
    assert!(
        blocks.iter().any(|block| block.readme == "README.md"),
        "no ```rust block found in README.md: is the fence parsing broken?"
    );

    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("readme_examples");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("the test's directory can be created");
    let prelude = Path::new(env!("CARGO_MANIFEST_DIR")).join("readme/prelude.rs");

    for block in &blocks {
        fs::write(dir.join(file_name(block)), wrap(block))
            .expect("the example file can be written");
    }
    let root = dir.join("readme_examples.rs");
    fs::write(&root, crate_root(&blocks, &prelude)).expect("the crate root can be written");
    trybuild::TestCases::new().pass(root);
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
