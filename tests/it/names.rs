//! State and reason names live in the rulebook alone (`sabi::store::rules`): the stores build
//! their SQL from the enums' names. This reads the stores' source and fails, naming the line,
//! wherever a quoted state or reason name appears outside the rulebook, so a rename is one edit
//! in one file and a backend cannot drift from the table it claims to follow.

use std::fs;
use std::path::{Path, PathBuf};

use sabi::domain::ReviewReason;
use sabi::store::rules::batch::{AnsweredBy, BatchState};
use sabi::store::rules::broadcast::{BroadcastState, PausedBy, RecipientState, SkipReason};
use sabi::store::rules::consent::Source;
use sabi::store::rules::item::ItemState;
use sabi::store::rules::part::{Delivery, PartKind, PartState};
use sabi::store::rules::review::ReviewState;

/// Where the names must not be written, and the quotes that make a name a literal there. A
/// Rust file is read up to its tests (`#[cfg(test)]`), whose fixtures may write old rows as
/// they were stored.
const PLACES: &[(&str, &[&str], &[char])] = &[
    ("src/store/sqlite", &["rs"], &['\'', '"']),
    ("src/store/postgres", &["rs", "sql"], &['\'', '"']),
];

/// Folders below those places that keep their names as written: applied migrations cannot
/// change (their checksums are checked on every start).
const KEPT: &[&str] = &["migrations"];

/// Every name the rulebook gives: a named enum added to `rules` must join this list, which the
/// count of `named!` in the rulebook keeps honest.
fn names() -> Vec<&'static str> {
    fn all<T: Copy>(all: &[T], name: fn(T) -> &'static str) -> Vec<&'static str> {
        all.iter().map(|v| name(*v)).collect()
    }
    [
        all(BatchState::ALL, BatchState::as_str),
        all(AnsweredBy::ALL, AnsweredBy::as_str),
        all(RecipientState::ALL, RecipientState::as_str),
        all(SkipReason::ALL, SkipReason::as_str),
        all(BroadcastState::ALL, BroadcastState::as_str),
        all(PausedBy::ALL, PausedBy::as_str),
        all(Source::ALL, Source::as_str),
        all(ItemState::ALL, ItemState::as_str),
        all(PartState::ALL, PartState::as_str),
        all(Delivery::ALL, Delivery::as_str),
        all(PartKind::ALL, PartKind::as_str),
        all(ReviewState::ALL, ReviewState::as_str),
        all(&ReviewReason::ALL, ReviewReason::as_str),
    ]
    .concat()
}

const NAMED_ENUMS: usize = 12;

fn files(dir: &Path, endings: &[&str], found: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() && !KEPT.contains(&name) {
            files(&path, endings, found);
        } else if endings.iter().any(|e| name.ends_with(&format!(".{e}"))) {
            found.push(path);
        }
    }
}

/// `file:line: text` for each quoted name in the places' files.
fn literals(root: &Path) -> Vec<String> {
    let names = names();
    let mut found = Vec::new();
    for (place, endings, quotes) in PLACES {
        let mut paths = Vec::new();
        files(&root.join(place), endings, &mut paths);
        for path in paths {
            let text = fs::read_to_string(&path).expect("source");
            let code = text.split("#[cfg(test)]").next().unwrap_or("");
            for (number, line) in code.lines().enumerate() {
                let quoted = names.iter().any(|name| {
                    quotes
                        .iter()
                        .any(|q| line.contains(&format!("{q}{name}{q}")))
                });
                if quoted {
                    let shown = path.strip_prefix(root).unwrap_or(&path).display();
                    found.push(format!("{shown}:{}: {}", number + 1, line.trim()));
                }
            }
        }
    }
    found
}

#[test]
fn no_state_or_reason_name_is_written_outside_the_rulebook() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let found = literals(root);
    assert!(
        found.is_empty(),
        "state or reason names written as literals (build them from the rulebook's enums):\n{}",
        found.join("\n")
    );
}

#[test]
fn every_named_enum_of_the_rulebook_is_read() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut rules = Vec::new();
    files(&root.join("src/store/rules"), &["rs"], &mut rules);
    let named = rules
        .iter()
        .map(|path| {
            let text = fs::read_to_string(path).expect("rulebook");
            text.lines()
                .filter(|line| line.starts_with("named!("))
                .count()
        })
        .sum::<usize>();
    assert_eq!(
        named, NAMED_ENUMS,
        "a named enum joined the rulebook: add it to names()"
    );
}

#[test]
fn the_scan_finds_a_name_written_as_a_literal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let place = dir.path().join("src/store/sqlite");
    fs::create_dir_all(place.join("migrations")).expect("dirs");
    fs::write(
        place.join("turns.rs"),
        "const A: &str = \"UPDATE batches SET state = 'running'\";\n#[cfg(test)]\n'done'\n",
    )
    .expect("write");
    fs::write(place.join("migrations/0001.sql"), "'running'\n").expect("write");
    fs::create_dir_all(dir.path().join("src/store/postgres")).expect("dirs");
    let found = literals(dir.path());
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("src/store/sqlite/turns.rs:1:"),
        "{found:?}"
    );
}
