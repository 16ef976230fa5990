//! How the README examples become modules of the `readme_examples` test: finding every
//! ```rust block of the workspace README and each crate's README, and wrapping each in a
//! module file that keeps the block at its README line numbers.
//!
//! Shared by the coord-tests build script (which writes the module files into the build
//! directory) and the `readme_examples` test (which compiles them in and checks the fences).
//! See `tests/tests/readme_examples.rs` for what a block may assume.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

/// How a block is wrapped, from the words after `rust` on its fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Context {
    /// The body of an async function with the examples' values as parameters.
    Statements,
    /// The body of `impl Service`.
    Methods,
}

/// One ```rust block of one README.
#[derive(Debug)]
pub(crate) struct Block {
    /// The README, relative to the workspace root (`README.md`, `coord-redis/README.md`).
    pub(crate) readme: String,
    /// The 1-based line of the opening fence.
    pub(crate) fence_line: usize,
    pub(crate) context: Context,
    /// The block's lines, without the fences (and without the fence's indentation).
    pub(crate) lines: Vec<String>,
}

/// The opening line of the statement context: one line, so that the block keeps its README
/// line numbers.
pub(crate) const STATEMENTS_OPEN: &str = "async fn readme_example(coord: Coordinator, \
    coordinator: Coordinator, service: Service, key: String, order: Order, order_id: String, \
    tenant_id: TenantId, symbol: &'static str, fingerprint: Fingerprint, env: &str) \
    -> Result<(), Box<dyn std::error::Error>> {";

/// `README.md` at the root, then each workspace directory's `README.md`, by name.
pub(crate) fn readmes(root: &Path) -> Vec<String> {
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
pub(crate) fn rust_blocks(readme: &str, text: &str, refused: &mut Vec<String>) -> Vec<Block> {
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
pub(crate) fn wrap(block: &Block) -> String {
    let mut file = format!(
        "#![allow(unused, dead_code, unnameable_test_items)] // {}, the rust block at line {} (written by the \
         readme_examples build script: edit the README, not this file)\n",
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

/// The generated module list, `include!`d at the root of the `readme_examples` test crate:
/// every block's module by absolute file path (the files sit in `dir`), and the two lists the
/// test checks at run time: the fences refused and the blocks compiled in.
pub(crate) fn module_list(blocks: &[Block], refused: &[String], dir: &Path) -> String {
    let mut list = String::from(
        "// Every rust block of the READMEs, one module each (written by the coord-tests build \
         script: edit the READMEs, not this file).\n\n",
    );
    let _ = writeln!(list, "const REFUSED: &[&str] = &{refused:?};");
    let compiled: Vec<String> = blocks.iter().map(block_name).collect();
    let _ = writeln!(list, "const COMPILED: &[&str] = &{compiled:?};\n");
    for block in blocks {
        let path = dir.join(file_name(block));
        let path = path.to_str().expect("the build directory's path is UTF-8");
        let _ = writeln!(
            list,
            "#[path = {path:?}]\n#[allow(clippy::all)]\nmod {};",
            module_name(block)
        );
    }
    list
}

/// How the lists name a block: `README.md:301`.
pub(crate) fn block_name(block: &Block) -> String {
    format!("{}:{}", block.readme, block.fence_line)
}

/// Every README's blocks, in the order `readmes` lists them, with the fences refused.
pub(crate) fn all_blocks(root: &Path) -> (Vec<Block>, Vec<String>) {
    let mut refused = Vec::new();
    let mut blocks = Vec::new();
    for readme in readmes(root) {
        let text = fs::read_to_string(root.join(&readme)).expect("a README is readable");
        blocks.extend(rust_blocks(&readme, &text, &mut refused));
    }
    (blocks, refused)
}

/// The module name for `block`, unique as its file name is: `coord_redis_readme_md_line_7`.
pub(crate) fn module_name(block: &Block) -> String {
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
pub(crate) fn file_name(block: &Block) -> String {
    format!(
        "{}_line_{}.rs",
        block.readme.replace('/', "_"),
        block.fence_line
    )
}
