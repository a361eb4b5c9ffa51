//! The crate's structure, from its own imports: every `use crate::…`, `use super::…`,
//! `use self::…` and inline `crate::…` path of the library's code (unit tests left out) is an
//! arrow from one file to another. No arrows may form a circle, and between top-level modules
//! an arrow may only point down the layers of `src/layers.txt`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Module = Vec<String>;

/// Every source file of the library, by its module path (`store::rules::part`).
fn modules(src: &Path) -> BTreeMap<Module, String> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("src is readable") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let Some(rel) = path.strip_prefix(src).ok().and_then(|p| p.to_str()) else {
                continue;
            };
            let Some(rel) = rel.strip_suffix(".rs") else {
                continue;
            };
            if rel == "main" {
                continue; // the binary: it only calls the library
            }
            let mut module: Module = rel.split('/').map(str::to_owned).collect();
            if matches!(module.last().map(String::as_str), Some("mod" | "lib")) {
                module.pop();
            }
            let code = std::fs::read_to_string(&path).expect("source is readable");
            found.insert(module, code);
        }
    }
    found
}

/// The code without comments and without its unit tests (they may reach anywhere).
fn production(code: &str) -> String {
    let code = code.split("#[cfg(test)]").next().unwrap_or_default();
    code.lines()
        .map(|line| line.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The paths a `use` tree names: `a::{b, c::{d, e as f}}` is `a::b`, `a::c::d`, `a::c::e`.
fn expand(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
    let mut depth = 0;
    let mut start = 0;
    let mut items = Vec::new();
    for (i, c) in tree.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&tree[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&tree[start..]);
    for item in items.into_iter().filter(|i| !i.is_empty()) {
        let segments = |s: &str| -> Vec<String> {
            s.split("::")
                .filter(|x| !x.is_empty())
                .map(str::to_owned)
                .collect()
        };
        match item.find('{') {
            Some(open) => {
                let mut path = prefix.to_vec();
                path.extend(segments(&item[..open]));
                expand(&path, &item[open + 1..item.len() - 1], out);
            }
            None => {
                let mut path = prefix.to_vec();
                path.extend(segments(item.split(" as ").next().unwrap_or(item)));
                out.push(path);
            }
        }
    }
}

/// The paths one file imports, each from the crate's root.
fn imports(module: &Module, code: &str) -> BTreeSet<Vec<String>> {
    let code = production(code);
    let mut paths = Vec::new();
    // What is not a `use` statement, for the inline `crate::` paths.
    let mut body = String::new();
    for statement in code.split(';') {
        // `use` as a word starting a line or after `pub`, never inside one (`Pause =>`).
        let at = statement
            .match_indices("use ")
            .map(|(at, _)| at)
            .find(|&at| {
                let before = &statement[..at];
                let word_starts = before.ends_with(char::is_whitespace) || before.is_empty();
                word_starts
                    && (before.trim().is_empty()
                        || before.trim_end().ends_with("pub")
                        || before.trim_end_matches([' ', '\t']).ends_with('\n'))
            });
        let Some(at) = at else {
            body.push_str(statement);
            body.push(';');
            continue;
        };
        body.push_str(&statement[..at]);
        // One space between words (`Batch as B`), none around punctuation.
        let words = statement[at + 4..]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let tree = ["::", "{", "}", ","].iter().fold(words, |t, p| {
            t.replace(&format!(" {p}"), p).replace(&format!("{p} "), p)
        });
        expand(&[], &tree, &mut paths);
    }
    let mut rest = body.as_str();
    while let Some(at) = rest.find("crate::") {
        let inline = rest[at..]
            .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .next()
            .unwrap_or_default();
        paths.push(
            inline
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
        );
        rest = &rest[at + 7..];
    }
    paths
        .into_iter()
        .filter_map(|path| {
            let (head, tail) = path.split_first()?;
            let mut from = match head.as_str() {
                "crate" => Vec::new(),
                "self" => module.clone(),
                "super" => module[..module.len().saturating_sub(1)].to_vec(),
                _ => return None,
            };
            let mut tail = tail.iter().peekable();
            while tail.peek().is_some_and(|s| *s == "super") {
                from.pop();
                tail.next();
            }
            from.extend(tail.cloned());
            Some(from)
        })
        .collect()
}

/// File-to-file arrows: each import points at the deepest file its path names. A folder's own
/// `mod.rs` and the files in it are one unit (the parent declares and re-exports its children,
/// which use its shared items), so arrows between a module and its ancestors are not counted.
fn arrows(files: &BTreeMap<Module, String>) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut arrows: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (module, code) in files {
        for path in imports(module, code) {
            let target = (0..=path.len())
                .rev()
                .map(|n| path[..n].to_vec())
                .find(|prefix| files.contains_key(prefix));
            let related = |t: &Module| t.starts_with(module) || module.starts_with(t);
            if let Some(target) = target.filter(|t| !related(t)) {
                arrows.entry(module.clone()).or_default().insert(target);
            }
        }
    }
    arrows
}

/// A circle through `start`, if the arrows make one.
fn circle_through(
    start: &Module,
    arrows: &BTreeMap<Module, BTreeSet<Module>>,
) -> Option<Vec<Module>> {
    let mut stack = vec![vec![start.clone()]];
    let mut seen = BTreeSet::new();
    while let Some(path) = stack.pop() {
        let last = path.last().expect("a path is never empty");
        for next in arrows.get(last).into_iter().flatten() {
            if next == start {
                return Some(path);
            }
            if seen.insert(next.clone()) {
                let mut longer = path.clone();
                longer.push(next.clone());
                stack.push(longer);
            }
        }
    }
    None
}

fn layers(list: &str) -> BTreeMap<String, usize> {
    let mut layer_of = BTreeMap::new();
    let lines = list
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'));
    for (layer, line) in lines.enumerate() {
        for module in line.split_whitespace() {
            let again = layer_of.insert(module.to_owned(), layer);
            assert!(
                again.is_none(),
                "{module} is listed twice in src/layers.txt"
            );
        }
    }
    layer_of
}

fn name(module: &Module) -> String {
    module.join("::")
}

#[test]
fn imports_point_down_the_layers_and_form_no_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = modules(&src);
    let arrows = arrows(&files);
    let circles: Vec<String> = files
        .keys()
        .filter_map(|m| circle_through(m, &arrows))
        .map(|c| c.iter().map(name).collect::<Vec<_>>().join(" -> "))
        .collect();
    assert!(
        circles.is_empty(),
        "imports in a circle:\n{}",
        circles.join("\n")
    );

    let list = std::fs::read_to_string(src.join("layers.txt")).expect("src/layers.txt");
    let layer_of = layers(&list);
    let mut wrong = Vec::new();
    for (from, targets) in &arrows {
        let Some(top) = from.first() else { continue };
        let Some(&here) = layer_of.get(top) else {
            wrong.push(format!("{top} is in no layer of src/layers.txt"));
            continue;
        };
        for to in targets {
            let there = layer_of.get(&to[0]).copied().unwrap_or(usize::MAX);
            if to[0] != *top && there >= here {
                wrong.push(format!("{} -> {}", name(from), name(to)));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "arrows src/layers.txt forbids:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_check_sees_arrows_of_every_kind() {
    let module: Module = vec!["store".into(), "postgres".into(), "ingest".into()];
    let code = "use super::{channel, outbox::{self, step}};\nuse crate::domain::Batch as B;\n\
                use crate::router::classifier::{\n    Classifier,\n};\n\
                fn f() { crate::clock::now(); }\n#[cfg(test)]\nuse crate::cli::x;";
    let found = imports(&module, code);
    let want: BTreeSet<Vec<String>> = [
        "store::postgres::channel",
        "store::postgres::outbox::self",
        "store::postgres::outbox::step",
        "domain::Batch",
        "router::classifier::Classifier",
        "clock::now",
    ]
    .iter()
    .map(|p| p.split("::").map(str::to_owned).collect())
    .collect();
    assert_eq!(found, want);
}
