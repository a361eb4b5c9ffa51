//! The intent router: its targets on the labelled corpus (cross-validated), its command-line
//! interface as outside tools use it, a bad intents file, and the router inside the turn.

use sabi::store::ReviewQuery;
use std::io::Write;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sabi::config::DEFAULT_INTENTS as DEFAULT;
use sabi::router::Router;
use sabi::router::eval::{
    FileScores, Report, Sample, calibrate, cross_validate, evaluate, generalisation,
    generalisation_table, with_thresholds,
};
use serde_json::Value;

use crate::helpers::{START_MS, TestApp, sabi_command, text_webhook_at};

/// A labelled file of the repository's (`SABI_INTENTS_CORPUS` names another folder).
fn samples(file: &str) -> Vec<Sample> {
    let dir = std::env::var("SABI_INTENTS_CORPUS")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/intents").to_owned());
    let path = format!("{dir}/{file}");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("labelled line"))
        .collect()
}

/// Every labelled file, measured three ways (cross-validated across the files,
/// leave-one-file-out, and on each file's fixed hold-out), with the table `sabi route --eval`
/// prints.
fn generalised() -> (Vec<(&'static str, FileScores)>, String) {
    let files = ["dev.jsonl", "dev-hard.jsonl", "dev-wild.jsonl"];
    let sets: Vec<Vec<Sample>> = files.iter().map(|f| samples(f)).collect();
    let scores = generalisation(DEFAULT, &sets, 5).expect("router builds");
    let table: Vec<(String, &FileScores)> =
        files.iter().map(|f| f.to_string()).zip(&scores).collect();
    let table = generalisation_table(&table);
    (files.into_iter().zip(scores).collect(), table)
}

/// Wrong local answers at most 2 % of local ones, out-of-scope messages to the agent at least
/// 97 %, and at least `min_local` of in-scope messages answered locally.
fn meets_targets(file: &str, report: &Report, min_local: f64) {
    eprintln!("{file}\n{report}");
    assert!(
        report.wrong_local_rate() <= 0.02,
        "{file}: wrong local {:.3}",
        report.wrong_local_rate()
    );
    assert!(
        report.local_rate() >= min_local,
        "{file}: answered locally {:.3}",
        report.local_rate()
    );
    assert!(
        report.out_of_scope_recall() >= 0.97,
        "{file}: out_of_scope to agent {:.3}",
        report.out_of_scope_recall()
    );
}

/// Issue #37's discipline: each file scored cross-validated and leave-one-file-out (learned
/// from the other files only: none of its author's phrasing). Every file meets every target
/// both ways (in-scope answered locally: 60 % on ordinary messages, 50 % on hard and wild
/// ones). The hold-outs are held to what a quarter of a file can show (BENCHMARKS.md, Router).
#[test]
fn each_file_cross_validated_and_left_out_of_learning() {
    let (scores, table) = generalised();
    eprintln!("{table}");
    let [dev, hard, wild] = [&scores[0], &scores[1], &scores[2]];
    for (min_local, (file, s)) in [(0.60, dev), (0.50, hard), (0.50, wild)] {
        meets_targets(file, &s.cross_validated, min_local);
        meets_targets(file, &s.leave_one_file_out, min_local);
    }
    // The hold-out is small (a quarter of each file): at most a couple of wrong answers each.
    for (file, s) in &scores {
        assert!(
            s.held_out.wrong_local <= 1,
            "{file}: hold-out\n{}",
            s.held_out
        );
        assert!(
            s.held_out.total >= 40,
            "{file}: a quarter of the file held out"
        );
    }
}

/// The built-in router as it ships, on each author's halves (tests/data/intents README:
/// `new-author-*`, `near-miss-*`, `everyday-*`, `lookalike-*`, `followup-*`, `voices-*`,
/// `moneytalk-*`, `short-*`, `shop-*`, `languages-*`, `ordinary-*`, `traps-*`, `week-*`,
/// `thirdparty-*`, `market-*`, `tongues-*`, `month-*`, `tricky-*`, `elders-*`, `hustle-*`,
/// `weekend-*`, `mixups-*`, `diaspora-*`, `rants-*`, `agents-*`, `genz-*`, `northern-*`,
/// `eastern-*`, `office-*`, `plain-*`, `western-*`, `voicenotes-*`, `retail-*`, `typos-*`,
/// `rural-*`, `security-*`, `family-*`, `december-*`, `pitfalls-*`, `kano-*`, `questions-*`,
/// `payday-*`, `students-*`, `lagos-*`, `smallbiz-*`, `stories-*`, `mixed-*`, `hardtwin-*`,
/// `wild-*`, `formal-*`, `pidgin-*`, `contrasts-*`, `pleasantries-*`, `apps-*`, `drivers-*`,
/// `worship-*`, `sarcasm-*`, `clinic-*`, `scams-*`, `faq-*`, `typing-*`, `hausa-*`, `yoruba-*`,
/// `igbo-*`, `numbers-*`, `emoji-*`, `letters-*`, `southsouth-*`, `negation-*`, `doubles-*`,
/// `loans-*`, `cards-*`, `ajo-*`, `abuja-*`, `betting-*`, `corrections-*`, `farmers-*`,
/// `telcos-*`, `crypto-*`, `landlords-*`, `pensions-*`, `travel-*`, `bills-*`, `shortest-*`,
/// `weddings-*`, `freelancers-*`, `schools-*`, `government-*`, `sallah-*`, `returns-*`,
/// `civil-*`, `ussd-*`, `replies-*`, `middlebelt-*`, `insurance-*`, `outage-*`, `corpers-*`,
/// `northeast-*`, `people-*`, `conditions-*`, `importers-*`, `night-*`),
/// each half scored alone. The `read` halves were read while writing rules, and those written
/// under the corpus's labelling rules are bundled for the classifier to learn from
/// (`src/router/labelled.jsonl`); the `sealed` halves never were read nor learned from, but
/// their author's other half was. Held at the exact figures of the build that set them, so that
/// a change that moves any file shows which (BENCHMARKS.md, Router, where each file's
/// first-sight figures are too, and where a floor that was lowered says why).
#[test]
fn the_router_as_shipped_on_each_authors_halves() {
    let router = Router::shared(DEFAULT).expect("router");
    for (file, min_local, max_wrong, min_out_of_scope) in [
        ("new-author-read.jsonl", 0.93, 0.02, 0.97),
        ("new-author-sealed.jsonl", 0.89, 0.04, 0.92),
        ("near-miss-read.jsonl", 0.95, 0.03, 0.96),
        ("near-miss-sealed.jsonl", 0.97, 0.03, 0.95),
        ("everyday-read.jsonl", 0.95, 0.02, 0.97),
        ("everyday-sealed.jsonl", 0.88, 0.02, 0.97),
        ("lookalike-read.jsonl", 0.93, 0.02, 0.97),
        ("lookalike-sealed.jsonl", 0.88, 0.02, 0.97),
        ("followup-read.jsonl", 0.94, 0.02, 0.97),
        ("followup-sealed.jsonl", 0.80, 0.02, 0.97),
        ("voices-read.jsonl", 0.95, 0.02, 0.97),
        ("voices-sealed.jsonl", 0.81, 0.02, 0.97),
        ("moneytalk-read.jsonl", 0.90, 0.02, 0.97),
        ("moneytalk-sealed.jsonl", 0.86, 0.02, 0.97),
        ("short-read.jsonl", 0.96, 0.02, 0.97),
        ("short-sealed.jsonl", 0.83, 0.02, 0.97),
        ("shop-read.jsonl", 0.93, 0.02, 0.97),
        ("shop-sealed.jsonl", 0.81, 0.02, 0.97),
        ("languages-read.jsonl", 0.87, 0.02, 0.97),
        ("languages-sealed.jsonl", 0.75, 0.02, 0.97),
        ("ordinary-read.jsonl", 0.94, 0.02, 0.97),
        ("ordinary-sealed.jsonl", 0.91, 0.02, 0.97),
        ("traps-read.jsonl", 0.88, 0.02, 0.97),
        ("traps-sealed.jsonl", 0.83, 0.02, 0.97),
        ("week-read.jsonl", 0.94, 0.02, 0.97),
        ("week-sealed.jsonl", 0.93, 0.02, 0.97),
        ("thirdparty-read.jsonl", 0.92, 0.02, 0.97),
        ("thirdparty-sealed.jsonl", 0.91, 0.02, 0.97),
        ("market-read.jsonl", 0.87, 0.02, 0.97),
        ("market-sealed.jsonl", 0.79, 0.02, 0.97),
        ("tongues-read.jsonl", 0.82, 0.02, 0.97),
        ("tongues-sealed.jsonl", 0.77, 0.02, 0.97),
        ("month-read.jsonl", 0.90, 0.02, 0.97),
        ("month-sealed.jsonl", 0.79, 0.02, 0.97),
        ("tricky-read.jsonl", 0.81, 0.02, 0.97),
        ("tricky-sealed.jsonl", 0.72, 0.02, 0.97),
        ("elders-read.jsonl", 0.89, 0.02, 0.97),
        ("elders-sealed.jsonl", 0.79, 0.02, 0.97),
        ("hustle-read.jsonl", 0.90, 0.02, 0.97),
        ("hustle-sealed.jsonl", 0.82, 0.02, 0.97),
        ("weekend-read.jsonl", 0.87, 0.02, 0.97),
        ("weekend-sealed.jsonl", 0.79, 0.02, 0.97),
        ("mixups-read.jsonl", 0.94, 0.02, 0.97),
        ("mixups-sealed.jsonl", 0.87, 0.04, 0.95),
        ("diaspora-read.jsonl", 0.88, 0.02, 0.97),
        ("diaspora-sealed.jsonl", 0.81, 0.02, 0.97),
        ("rants-read.jsonl", 0.82, 0.02, 0.97),
        ("rants-sealed.jsonl", 0.66, 0.02, 0.97),
        ("agents-read.jsonl", 0.88, 0.02, 0.97),
        ("agents-sealed.jsonl", 0.79, 0.02, 0.97),
        ("genz-read.jsonl", 0.89, 0.02, 0.97),
        ("genz-sealed.jsonl", 0.86, 0.02, 0.97),
        ("northern-read.jsonl", 0.78, 0.02, 0.97),
        ("northern-sealed.jsonl", 0.66, 0.02, 0.97),
        ("eastern-read.jsonl", 0.81, 0.02, 0.97),
        ("eastern-sealed.jsonl", 0.66, 0.02, 0.97),
        ("office-read.jsonl", 0.91, 0.02, 0.97),
        ("office-sealed.jsonl", 0.84, 0.02, 0.97),
        ("plain-read.jsonl", 0.95, 0.02, 0.97),
        ("plain-sealed.jsonl", 0.95, 0.02, 0.97),
        ("western-read.jsonl", 0.90, 0.02, 0.97),
        ("western-sealed.jsonl", 0.75, 0.03, 0.97),
        ("voicenotes-read.jsonl", 0.84, 0.02, 0.97),
        ("voicenotes-sealed.jsonl", 0.78, 0.02, 0.97),
        ("retail-read.jsonl", 0.87, 0.02, 0.97),
        ("retail-sealed.jsonl", 0.84, 0.02, 0.97),
        ("typos-read.jsonl", 0.80, 0.02, 0.97),
        ("typos-sealed.jsonl", 0.71, 0.03, 0.97),
        ("rural-read.jsonl", 0.85, 0.02, 0.97),
        ("rural-sealed.jsonl", 0.75, 0.02, 0.97),
        ("security-read.jsonl", 0.85, 0.02, 0.97),
        ("security-sealed.jsonl", 0.81, 0.03, 0.96),
        ("family-read.jsonl", 0.86, 0.02, 0.97),
        ("family-sealed.jsonl", 0.72, 0.03, 0.96),
        ("december-read.jsonl", 0.85, 0.02, 0.97),
        ("december-sealed.jsonl", 0.78, 0.02, 0.97),
        ("pitfalls-read.jsonl", 0.94, 0.02, 0.97),
        ("pitfalls-sealed.jsonl", 0.90, 0.02, 0.97),
        ("kano-read.jsonl", 0.75, 0.02, 0.97),
        ("kano-sealed.jsonl", 0.61, 0.02, 0.97),
        ("questions-read.jsonl", 0.84, 0.02, 0.97),
        ("questions-sealed.jsonl", 0.87, 0.02, 0.97),
        ("payday-read.jsonl", 0.84, 0.02, 0.97),
        ("payday-sealed.jsonl", 0.86, 0.02, 0.97),
        ("students-read.jsonl", 0.93, 0.02, 0.97),
        ("students-sealed.jsonl", 0.84, 0.02, 0.97),
        ("lagos-read.jsonl", 0.94, 0.02, 0.97),
        ("lagos-sealed.jsonl", 0.87, 0.02, 0.97),
        ("smallbiz-read.jsonl", 0.88, 0.02, 0.97),
        ("smallbiz-sealed.jsonl", 0.85, 0.03, 0.96),
        ("stories-read.jsonl", 0.70, 0.02, 0.97),
        ("stories-sealed.jsonl", 0.50, 0.02, 0.97),
        ("formal-read.jsonl", 0.88, 0.02, 0.97),
        ("formal-sealed.jsonl", 0.77, 0.02, 0.97),
        ("hardtwin-read.jsonl", 0.86, 0.02, 0.97),
        ("hardtwin-sealed.jsonl", 0.82, 0.02, 0.97),
        ("mixed-read.jsonl", 0.92, 0.02, 0.97),
        ("mixed-sealed.jsonl", 0.86, 0.02, 0.97),
        ("wild-read.jsonl", 0.84, 0.02, 0.97),
        ("wild-sealed.jsonl", 0.86, 0.02, 0.96),
        ("apps-read.jsonl", 0.89, 0.02, 0.97),
        ("apps-sealed.jsonl", 0.77, 0.02, 0.96),
        ("contrasts-read.jsonl", 0.76, 0.02, 0.97),
        ("contrasts-sealed.jsonl", 0.65, 0.02, 0.97),
        ("pidgin-read.jsonl", 0.85, 0.02, 0.96),
        ("pidgin-sealed.jsonl", 0.76, 0.02, 0.97),
        ("pleasantries-read.jsonl", 0.96, 0.02, 0.97),
        ("pleasantries-sealed.jsonl", 0.82, 0.02, 0.97),
        ("clinic-read.jsonl", 0.89, 0.02, 0.97),
        ("clinic-sealed.jsonl", 0.78, 0.02, 0.97),
        ("drivers-read.jsonl", 0.90, 0.02, 0.97),
        ("drivers-sealed.jsonl", 0.80, 0.02, 0.97),
        ("sarcasm-read.jsonl", 0.76, 0.02, 0.97),
        ("sarcasm-sealed.jsonl", 0.63, 0.02, 0.97),
        ("worship-read.jsonl", 0.87, 0.02, 0.97),
        ("worship-sealed.jsonl", 0.81, 0.02, 0.97),
        ("faq-read.jsonl", 0.91, 0.02, 0.97),
        ("faq-sealed.jsonl", 0.86, 0.02, 0.97),
        ("hausa-read.jsonl", 0.74, 0.02, 0.97),
        ("hausa-sealed.jsonl", 0.60, 0.02, 0.97),
        ("scams-read.jsonl", 0.86, 0.02, 0.97),
        ("scams-sealed.jsonl", 0.81, 0.04, 0.95),
        ("typing-read.jsonl", 0.85, 0.02, 0.97),
        ("typing-sealed.jsonl", 0.75, 0.02, 0.97),
        ("emoji-read.jsonl", 0.92, 0.02, 0.97),
        ("emoji-sealed.jsonl", 0.84, 0.02, 0.97),
        ("igbo-read.jsonl", 0.78, 0.02, 0.97),
        ("igbo-sealed.jsonl", 0.61, 0.03, 0.96),
        ("numbers-read.jsonl", 0.85, 0.02, 0.97),
        ("numbers-sealed.jsonl", 0.78, 0.03, 0.97),
        ("yoruba-read.jsonl", 0.75, 0.02, 0.97),
        ("yoruba-sealed.jsonl", 0.68, 0.02, 0.97),
        ("doubles-read.jsonl", 0.90, 0.02, 0.97),
        ("doubles-sealed.jsonl", 0.80, 0.04, 0.94),
        ("letters-read.jsonl", 0.89, 0.02, 0.97),
        ("letters-sealed.jsonl", 0.88, 0.02, 0.97),
        ("negation-read.jsonl", 0.73, 0.02, 0.97),
        ("negation-sealed.jsonl", 0.70, 0.02, 0.97),
        ("southsouth-read.jsonl", 0.90, 0.02, 0.97),
        ("southsouth-sealed.jsonl", 0.86, 0.02, 0.97),
        ("abuja-read.jsonl", 0.91, 0.02, 0.97),
        ("abuja-sealed.jsonl", 0.85, 0.02, 0.97),
        ("ajo-read.jsonl", 0.92, 0.02, 0.97),
        ("ajo-sealed.jsonl", 0.82, 0.02, 0.97),
        ("cards-read.jsonl", 0.89, 0.02, 0.97),
        ("cards-sealed.jsonl", 0.78, 0.02, 0.97),
        ("loans-read.jsonl", 0.78, 0.02, 0.97),
        ("loans-sealed.jsonl", 0.81, 0.08, 0.95),
        ("betting-read.jsonl", 0.82, 0.02, 0.97),
        ("betting-sealed.jsonl", 0.76, 0.05, 0.94),
        ("corrections-read.jsonl", 0.80, 0.02, 0.97),
        ("corrections-sealed.jsonl", 0.77, 0.02, 0.97),
        ("farmers-read.jsonl", 0.87, 0.02, 0.97),
        ("farmers-sealed.jsonl", 0.82, 0.02, 0.97),
        ("telcos-read.jsonl", 0.89, 0.02, 0.97),
        ("telcos-sealed.jsonl", 0.80, 0.02, 0.97),
        ("crypto-read.jsonl", 0.91, 0.02, 0.97),
        ("crypto-sealed.jsonl", 0.81, 0.02, 0.97),
        ("landlords-read.jsonl", 0.92, 0.02, 0.97),
        ("landlords-sealed.jsonl", 0.81, 0.02, 0.97),
        ("pensions-read.jsonl", 0.91, 0.02, 0.97),
        ("pensions-sealed.jsonl", 0.71, 0.04, 0.96),
        ("travel-read.jsonl", 0.88, 0.02, 0.97),
        ("travel-sealed.jsonl", 0.76, 0.02, 0.97),
        ("bills-read.jsonl", 0.94, 0.02, 0.97),
        ("bills-sealed.jsonl", 0.67, 0.02, 0.97),
        ("freelancers-read.jsonl", 0.91, 0.02, 0.97),
        ("freelancers-sealed.jsonl", 0.85, 0.02, 0.97),
        ("shortest-read.jsonl", 0.94, 0.02, 0.97),
        ("shortest-sealed.jsonl", 0.81, 0.03, 0.97),
        ("weddings-read.jsonl", 0.88, 0.02, 0.97),
        ("weddings-sealed.jsonl", 0.81, 0.02, 0.97),
        ("government-read.jsonl", 0.85, 0.02, 0.97),
        ("government-sealed.jsonl", 0.83, 0.03, 0.96),
        ("returns-read.jsonl", 0.92, 0.02, 0.97),
        ("returns-sealed.jsonl", 0.77, 0.02, 0.92),
        ("sallah-read.jsonl", 0.89, 0.02, 0.97),
        ("sallah-sealed.jsonl", 0.78, 0.02, 0.97),
        ("schools-read.jsonl", 0.90, 0.02, 0.97),
        ("schools-sealed.jsonl", 0.74, 0.02, 0.97),
        ("civil-read.jsonl", 0.85, 0.02, 0.97),
        ("civil-sealed.jsonl", 0.80, 0.02, 0.97),
        ("middlebelt-read.jsonl", 0.88, 0.02, 0.97),
        ("middlebelt-sealed.jsonl", 0.87, 0.02, 0.97),
        ("replies-read.jsonl", 0.87, 0.02, 0.97),
        ("replies-sealed.jsonl", 0.85, 0.02, 0.97),
        ("ussd-read.jsonl", 0.84, 0.02, 0.97),
        ("ussd-sealed.jsonl", 0.88, 0.02, 0.97),
        ("corpers-read.jsonl", 0.86, 0.02, 0.97),
        ("corpers-sealed.jsonl", 0.89, 0.02, 0.97),
        ("insurance-read.jsonl", 0.87, 0.02, 0.97),
        ("insurance-sealed.jsonl", 0.84, 0.02, 0.97),
        ("northeast-read.jsonl", 0.86, 0.02, 0.97),
        ("northeast-sealed.jsonl", 0.82, 0.02, 0.97),
        ("outage-read.jsonl", 0.83, 0.02, 0.97),
        ("outage-sealed.jsonl", 0.82, 0.02, 0.97),
        ("conditions-read.jsonl", 0.88, 0.02, 0.97),
        ("conditions-sealed.jsonl", 0.75, 0.03, 0.96),
        ("importers-read.jsonl", 0.97, 0.02, 0.97),
        ("importers-sealed.jsonl", 0.81, 0.02, 0.97),
        ("night-read.jsonl", 0.93, 0.02, 0.97),
        ("night-sealed.jsonl", 0.86, 0.02, 0.97),
        ("people-read.jsonl", 0.88, 0.03, 0.96),
        ("people-sealed.jsonl", 0.80, 0.02, 0.97),
    ] {
        let report = evaluate(&router, &samples(file));
        eprintln!("{file}\n{report}");
        assert!(report.local_rate() >= min_local, "{file}: local");
        assert!(report.wrong_local_rate() <= max_wrong, "{file}: wrong");
        assert!(
            report.out_of_scope_recall() >= min_out_of_scope,
            "{file}: out of scope"
        );
    }
}

#[test]
fn thresholds_calibrated_on_some_messages_hold_on_others() {
    let all: Vec<Sample> = [samples("dev.jsonl"), samples("dev-hard.jsonl")].concat();
    let mut calibration = Vec::new();
    let mut held_back = Vec::new();
    for (i, sample) in all.into_iter().enumerate() {
        if i % 3 == 0 {
            held_back.push(sample);
        } else {
            calibration.push(sample);
        }
    }
    let thresholds = calibrate(DEFAULT, &calibration, 5, 0.02).expect("calibrates");
    // The floors set from first-sight decisions hold: these messages, which the rules were
    // written on, would calibrate them to nothing.
    for (intent, floor) in [("card_issue", 0.65), ("failed_transaction", 0.50)] {
        let set = thresholds
            .iter()
            .find(|t| t.intent == intent)
            .expect(intent);
        assert!(set.confirm >= floor, "{intent}: confirm {}", set.confirm);
    }
    let calibrated = with_thresholds(DEFAULT, &thresholds).expect("the calibrated file loads");
    let report = cross_validate(&calibrated, &held_back, 5).expect("router builds");
    eprintln!("{report}");
    assert!(
        report.wrong_local_rate() <= 0.02,
        "wrong local on held-back messages {:.3}",
        report.wrong_local_rate()
    );
    // Each fold here learns from a third of the messages only: fewer answer locally than
    // when the router learns from all of them.
    assert!(report.local_rate() >= 0.5, "{:.3}", report.local_rate());
}

/// `--calibrate --write` keeps a confirm held at a hand-set floor exactly, so the file it writes
/// loads (a floor of 0.655 written as 0.65 would be refused).
#[test]
fn a_confirm_held_at_its_floor_is_written_exactly() {
    let source = "[[intent]]\nname = \"card\"\naction = \"agent\"\nexamples = [\"my card\"]\n\
                  threshold = 0.5\nconfirm = 0.7\nconfirm_floor = 0.655\n";
    let held = sabi::router::eval::Thresholds {
        intent: "card".into(),
        confirm: 0.655,
        threshold: 0.45,
        local: 0,
        wrong: 0,
    };
    let written = with_thresholds(source, &[held]).expect("a confirm at its floor loads");
    assert!(written.contains("confirm = 0.655"), "{written}");
    assert!(written.contains("threshold = 0.45"), "{written}");
    let whole = sabi::router::eval::Thresholds {
        intent: "card".into(),
        confirm: 1.0,
        threshold: 1.0,
        local: 0,
        wrong: 0,
    };
    let written = with_thresholds(source, &[whole]).expect("loads");
    assert!(
        written.contains("confirm = 1.0"),
        "a float, not an integer: {written}"
    );
}

/// Each kind of mistake the router used to make, as a rule of the language: messages written
/// for this test, in none of the labelled files.
#[test]
fn each_kind_of_mistake_is_handled_as_a_rule() {
    let router = Router::shared(DEFAULT).expect("router");
    let agent = |text: &str| {
        let routing = router.route(text);
        assert!(!routing.local, "{text:?} went local as {}", routing.intent);
    };
    let local = |text: &str, intent: &str| {
        let routing = router.route(text);
        assert!(
            routing.local && routing.intent == intent,
            "{text:?}: {} (local {})",
            routing.intent,
            routing.local
        );
    };
    let never = |text: &str, wrong: &str| {
        let routing = router.route(text);
        assert!(
            !(routing.local && routing.intent == wrong),
            "{text:?} answered as {wrong}"
        );
    };
    // Routine words in another sense.
    agent("the balance of my gym membership plan is wrong");
    agent("my landlord never refund my caution deposit");
    agent("I misplaced my national identity card at the stadium");
    agent("how do I become one of your cashless point agents");
    // A person wins over another intent.
    local(
        "my transfer failed and I want to talk to a human now",
        "agent_escalation",
    );
    local(
        "una app don fail me twice, make somebody call me abeg",
        "agent_escalation",
    );
    local(
        "I need a refund for the blender and I want your supervisor on it",
        "agent_escalation",
    );
    local("put me through to the branch manager", "agent_escalation");
    // Negation with a wider scope.
    never("na my statement I want, no be balance", "check_balance");
    never(
        "no block the card o, just tell me why e decline",
        "card_issue",
    );
    // Two routine requests: the agent answers.
    agent("check my balance and buy me 500 airtime");
    // A greeting before an unrelated question: the question decides.
    never(
        "good morning, which branch is open on Sunday in Yaba?",
        "greeting",
    );
    // A failed purchase where money left: a failed transaction, never a purchase.
    never(
        "I buy 2k airtime, money comot but airtime never land",
        "airtime_data",
    );
    never(
        "paid the rider with transfer, debited 15k but he left with the parcel",
        "order_status",
    );
    // Money asked back after an order went wrong: a refund, not an order question.
    never(
        "the parcel never arrive after two weeks, just return my 8k",
        "order_status",
    );
    // Something seen or done already, with thanks: thanks, not the thing seen.
    never(
        "I can see the refund in my account now, thank you",
        "refund_request",
    );
    // A bank's name is no "first ..., then ..." instruction.
    local(
        "I sent 5k from First Bank then e fail, money never enter",
        "failed_transaction",
    );
    // Words typed in a hurry are read as the words meant (vowels dropped, a letter slipped).
    local(
        "send me my acount statmnt for last mnth",
        "transaction_history",
    );
    local("whre is my packge? i ordred since monday", "order_status");
    // A call or text told as news is a report (often a scam), not a person asked for.
    agent("someone texted me saying my card will be blocked unless I send my BVN");
    never(
        "person call me this morning say I won a loan promo, na una?",
        "agent_escalation",
    );
    local("can someone call me about my loan", "agent_escalation");
    local("someone should attend to me abeg", "agent_escalation");
    // Someone else's request in Yoruba or Igbo word order, and fraud with the customer's
    // identity: the agent answers.
    agent("egbon mi fe loan, se o le ri?");
    agent("somebody used my BVN to open an account with you");
    // A request under a condition the customer sets, whatever it asks.
    agent("if the new card is not here by friday, cancel it and replace it");
    // The customer's own history asked for by its structure: a list of money movements, or
    // what was spent and then a list, in English, Pidgin and Hausa.
    local("wetin I spend this weekend? list am", "transaction_history");
    local(
        "I want to see all the alerts that came in since the 1st",
        "transaction_history",
    );
    local(
        "Nuna min tarihin kudin da na kashe a makon jiya",
        "transaction_history",
    );
    // A loan with its owner after it (Igbo, Yoruba), and "borrow", which the lexicon reads as
    // "loan", as the verb; a friend's loan stays the agent's.
    local("Kedu mgbe m ga-akwụ loan m?", "loan_inquiry");
    local("una fit borrow me 30k till Friday?", "loan_inquiry");
    agent("my brother loan me 10k, how I go pay am back");
    // Two requests, one of them spelt "where's": neither is answered alone.
    agent("Where's my parcel and what's my balance?");
    // A request the classifier reads alone is asked by its marker, its paperwork, a wait told,
    // or in Igbo a sending gone wrong; a question about the business stays the agent's.
    local(
        "my parcel still dey Ibadan hub since Monday",
        "order_status",
    );
    local(
        "Biko ego m apụọla mana nwanne m enwetaghị ya",
        "failed_transaction",
    );
    local("requirements for a joint account", "account_opening");
    local("gimme your supervisor", "agent_escalation");
    agent("please, is your branch open on Sunday?");
    // The marker gives a two-word message no object: a topic asked for with a please still
    // leaves the agent to ask what about it.
    for fragment in ["card please", "order abeg", "money please", "transfer biko"] {
        agent(fragment);
    }
    // What was asked for came, told after it: thanks, not the request; an arrival denied or a
    // debit that came is still the complaint.
    local(
        "the reversal don enter my account, thank you sir",
        "thanks_goodbye",
    );
    local("my parcel has not come, where is it?", "order_status");
    never("the data wey I buy don finally land", "airtime_data");
    local("my card has arrived, how do I activate it?", "card_issue");
    local(
        "POS say e fail but my debit alert don come, reverse am",
        "failed_transaction",
    );
    // An arrival told in another clause leaves the request in its own.
    local("what's my balance? the airtime don land", "check_balance");
    // "I've" is "I have": what follows was done.
    local("ok I've seen the mini statement, thanks", "thanks_goodbye");
    // A condition after a polite opener, unlike the politeness "if you fit".
    agent("Please if the transfer no reverse by Friday, reverse it and pay my landlord");
    local(
        "abeg if you fit reverse my failed transfer",
        "failed_transaction",
    );
    // A clause that says why is no second request; a question the intents do not cover is.
    local(
        "what's my wallet balance? I want to plan my week",
        "check_balance",
    );
    local(
        "track my order abeg, I need am before Sunday service",
        "order_status",
    );
    agent("what's my balance? I want to know your branch address in Ikeja");
    // A card unblocked, stuck (the lexicon's "pending"), its PIN locked, on its way; an app's
    // PIN is not the card's.
    local("pls unblock my virtual card, I'm abroad", "card_issue");
    local("my card got stuck in the ATM at Yaba", "card_issue");
    local("PIN locked after too many tries", "card_issue");
    never("my app PIN is locked", "card_issue");
    // Lending asked of the business, a repayment, a shop's pay-later credit. With "abeg" after
    // it the classifier is less sure (0.83, under loan's confirm of 0.85): the agent answers,
    // never as something else (BENCHMARKS, round twenty-four).
    local("lend me 20k till month end", "loan_inquiry");
    let polite = router.route("lend me 20k till month end abeg");
    assert!(
        !polite.local || polite.intent == "loan_inquiry",
        "{polite:?}"
    );
    local("when is my next repayment?", "loan_inquiry");
    local("how much do I still owe on my pay later?", "loan_inquiry");
    // A history asked for by the movements it lists.
    local(
        "show me all withdrawals from my account this week",
        "transaction_history",
    );
}

/// Everyday words of Yoruba, Igbo and Hausa mixed into a request are read as the English words
/// they stand for (the lexicon), so such requests are answered like their English twins.
#[test]
fn yoruba_igbo_and_hausa_words_are_read_as_their_english_twins() {
    let router = Router::shared(DEFAULT).expect("router");
    for (text, intent) in [
        ("Ina son bude asusu na ajiya", "account_opening"),
        ("Barka da safe", "greeting"),
        ("Mo fe ya owo fun business mi", "loan_inquiry"),
        ("Achọrọ m mbinye ego biko", "loan_inquiry"),
        ("Ẹ kú ìrọ̀lẹ́", "greeting"),
        ("Sai gobe, na gode", "thanks_goodbye"),
    ] {
        let routing = router.route(text);
        assert_eq!(
            (routing.intent.as_str(), routing.local),
            (intent, true),
            "{text}: {routing:?}"
        );
    }
    // "credit" is airtime in Nigerian English.
    let routing = router.route("abeg credit me 1k Glo");
    assert_eq!(
        (routing.intent.as_str(), routing.local),
        ("airtime_data", true)
    );
}

#[test]
fn route_jsonl_writes_one_decision_per_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = sabi_command(dir.path())
        .args(["route", "--jsonl"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sabi route runs");
    let input = concat!(
        r#"{"id": "x1", "text": "abeg buy 2k airtime for 08031234567"}"#,
        "\n",
        "Pay my DSTV bill\n",
        "\n",
        r#"{"text": "I wan talk to human"}"#,
        "\n"
    );
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("written");
    let output = child.wait_with_output().expect("finished");
    assert!(output.status.success());
    let lines: Vec<Value> = String::from_utf8(output.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    assert_eq!(lines.len(), 3);
    for line in &lines {
        for key in ["intent", "confidence", "tier", "local", "entities"] {
            assert!(line.get(key).is_some(), "{key} missing in {line}");
        }
    }
    assert_eq!(lines[0]["intent"], "airtime_data");
    assert_eq!(lines[0]["local"], true);
    assert_eq!(lines[0]["entities"]["phones"][0], "08031234567");
    assert_eq!(lines[0]["entities"]["amounts"][0]["value"], 2000.0);
    assert_eq!(lines[1]["local"], false);
    assert_eq!(lines[2]["intent"], "agent_escalation");
}

#[test]
fn a_bad_intents_file_stops_start_up_with_its_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("intents.toml");
    std::fs::write(
        &file,
        "[[intent]]\nname = \"greeting\"\naction = \"reply\"\nreply = \"hi\"\npatterns = ['(unclosed']\n",
    )
    .expect("written");
    let output = sabi_command(dir.path())
        .args(["serve"])
        .env("SABI_LISTEN", "127.0.0.1:0")
        .env("SABI_INTENTS_FILE", &file)
        .output()
        .expect("sabi serve runs");
    assert!(!output.status.success(), "start-up must fail");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("line 5") && stderr.contains("invalid pattern"),
        "{stderr}"
    );
}

/// Routine messages are answered from the intents file without the agent; a request for a
/// person goes to review with a note to the customer; the rest reaches the agent (its sandbox
/// stand-in here).
#[tokio::test]
async fn the_router_answers_in_the_turn() {
    let app = TestApp::spawn().await;
    let t = START_MS / 1000;
    for (n, (customer, text)) in [
        ("2348000000001", "I wan check my balance"),
        ("2348000000002", "I wan talk to human abeg"),
        ("2348000000003", "Who go win the league this year?"),
    ]
    .iter()
    .enumerate()
    {
        let body = text_webhook_at(&format!("wamid.r{n}"), customer, text, t);
        assert_eq!(app.post_whatsapp_webhook(body).await.status(), 200);
    }
    app.clock.advance(Duration::from_secs(20));
    assert_eq!(app.scheduler.drain().await.expect("drain"), 3);

    let outbox = app.store.outbox(None).await.expect("outbox");
    let reply_to = |customer: &str| -> String {
        outbox
            .iter()
            .find(|o| o.conversation.customer == customer)
            .map(|o| o.text.clone())
            .unwrap_or_default()
    };
    assert!(reply_to("2348000000001").contains("balance"), "{outbox:?}");
    assert!(
        reply_to("2348000000002").contains("Connecting you"),
        "{outbox:?}"
    );
    assert!(
        reply_to("2348000000003").contains("we have your message"),
        "{outbox:?}"
    );

    let review = app
        .store
        .review_queue(ReviewQuery::default())
        .await
        .expect("review");
    assert_eq!(review.len(), 1);
    assert_eq!(review[0].reason.as_str(), "handoff_asked");
    assert_eq!(review[0].conversation.customer, "2348000000002");
}

#[test]
fn route_prints_a_decision_for_people() {
    let dir = tempfile::tempdir().expect("tempdir");
    let output = sabi_command(dir.path())
        .args(["route", "show me my acct bal"])
        .output()
        .expect("runs");
    assert!(output.status.success());
    let text = String::from_utf8_lossy(&output.stdout);
    for field in [
        "intent      check_balance",
        "confidence",
        "tier",
        "local       yes",
        "normalised",
        "took",
    ] {
        assert!(text.contains(field), "{field} missing:\n{text}");
    }
}

#[test]
fn a_sealed_file_is_scored_without_printing_a_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Labelled wrong on purpose: the router's answer counts as a mistake.
    let lines = r#"{"id": "x-1", "text": "abeg check my account balance", "intent": "greeting"}
{"id": "x-2", "text": "good morning", "intent": "greeting"}
"#;
    for (name, listed) in [("probe-read.jsonl", true), ("probe-sealed.jsonl", false)] {
        let file = dir.path().join(name);
        std::fs::write(&file, lines).expect("writes");
        let output = sabi_command(dir.path())
            .args(["route", "--folds", "0", "--eval"])
            .arg(&file)
            .output()
            .expect("runs");
        assert!(output.status.success());
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(text.contains("wrong local         0.500"), "{text}");
        assert_eq!(
            text.contains("check my account balance"),
            listed,
            "{name}:\n{text}"
        );
        assert_eq!(
            text.contains("1 in the hold-out or a sealed file, not shown"),
            !listed,
            "{name}:\n{text}"
        );
    }
}

#[test]
fn several_files_scored_as_configured_end_with_a_table_and_their_total() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files = [
        // One right local answer, one out-of-scope message sent on.
        (
            "a.jsonl",
            r#"{"text": "abeg check my account balance", "intent": "check_balance"}
{"text": "who won the match last night", "intent": "out_of_scope"}
"#,
        ),
        // One wrong local answer (labelled wrong on purpose).
        (
            "b.jsonl",
            r#"{"text": "abeg check my account balance", "intent": "greeting"}
"#,
        ),
    ];
    let mut command = sabi_command(dir.path());
    command.args(["route", "--folds", "0", "--eval"]);
    for (name, lines) in files {
        let file = dir.path().join(name);
        std::fs::write(&file, lines).expect("writes");
        command.arg(file);
    }
    let output = command.output().expect("runs");
    assert!(output.status.success());
    let text = String::from_utf8_lossy(&output.stdout);
    let table = text
        .split("per file (as configured)")
        .nth(1)
        .unwrap_or_else(|| panic!("no table:\n{text}"));
    let row = |name: &str| {
        let line = table
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no row {name}:\n{table}"));
        line.split_whitespace()
            .skip(1)
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(row("a.jsonl"), "2 0.0 % 0/1 100.0 % 1/1 100.0 % 1/1");
    // Labelled greeting, it is in scope: answered locally, wrongly.
    assert_eq!(row("b.jsonl"), "1 100.0 % 1/1 0.0 % 0/0 100.0 % 1/1");
    assert_eq!(row("total"), "3 50.0 % 1/2 100.0 % 1/1 100.0 % 2/2");
}

/// A fake business API for tool calls: `/balance` answers with a nested field and records the
/// query it was called with; `/down` fails.
async fn fake_tool_server() -> (std::net::SocketAddr, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let app = axum::Router::new()
        .route(
            "/balance",
            axum::routing::get(
                move |uri: axum::http::Uri, headers: axum::http::HeaderMap| {
                    let record = record.clone();
                    async move {
                        let auth = headers
                            .get("authorization")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_owned();
                        record
                            .lock()
                            .expect("lock")
                            .push(format!("{} {auth}", uri.query().unwrap_or("")));
                        axum::Json(serde_json::json!({"account": {"available": "₦12,500.00"}}))
                    }
                },
            ),
        )
        .route(
            "/down",
            axum::routing::get(|| async { axum::http::StatusCode::INTERNAL_SERVER_ERROR }),
        )
        // An answer that names a placeholder itself: filled as text, never read again.
        .route(
            "/loop",
            axum::routing::get(|| async {
                axum::Json(serde_json::json!({"account": {"available": "{{tool.balance.account.available}}"}}))
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, seen)
}

/// An app whose balance reply reads `{{tool.balance.account.available}}` from a tool at `path`.
async fn app_with_balance_tool(addr: std::net::SocketAddr, path: &str) -> TestApp {
    let dir = tempfile::tempdir().expect("tempdir");
    let intents = DEFAULT.replace(
        "reply = \"Your available balance is shown in the app under Accounts. For your security we share balances only after you confirm your identity in the app.\"",
        "reply = \"Your available balance is {{tool.balance.account.available}}.\"",
    );
    assert_ne!(intents, DEFAULT, "the balance reply was found");
    let intents_file = dir.path().join("intents.toml");
    std::fs::write(&intents_file, intents).expect("intents written");
    let config = format!(
        "[router]\nintents_file = {:?}\n\n[[tools]]\nname = \"balance\"\nurl = \"http://{addr}{path}?customer={{customer}}\"\nheaders = {{ Authorization = \"Bearer tool-token\" }}\ntimeout = \"2s\"\n",
        intents_file
    );
    std::fs::write(dir.path().join("sabi.toml"), config).expect("config written");
    TestApp::spawn_in(dir, None, &[]).await
}

#[tokio::test]
async fn a_reply_template_uses_a_tool_and_falls_back_when_it_fails() {
    let (addr, seen) = fake_tool_server().await;
    for (path, expected) in [
        ("/balance", "Your available balance is ₦12,500.00."),
        ("/down", "we have your message"),
        (
            "/loop",
            "Your available balance is {{tool.balance.account.available}}.",
        ),
    ] {
        let app = app_with_balance_tool(addr, path).await;
        let body = text_webhook_at(
            "wamid.tool",
            "2348000000007",
            "abeg wetin be my balance",
            START_MS / 1000,
        );
        assert_eq!(app.post_whatsapp_webhook(body).await.status(), 200);
        app.clock.advance(Duration::from_secs(20));
        assert_eq!(app.scheduler.drain().await.expect("drain"), 1);
        let outbox = app.store.outbox(None).await.expect("outbox");
        assert!(
            outbox[0].text.contains(expected),
            "{path}: {:?}",
            outbox[0].text
        );
    }
    let calls = seen.lock().expect("lock").clone();
    assert_eq!(calls, vec!["customer=2348000000007 Bearer tool-token"]);
}

/// Learning from use, end to end: every turn keeps the router's guess; a person labels a
/// handed-over message through the desk's API; `sabi route --export-unsure` lists that turn
/// first with its label and the others to label; the file, once labelled, scores and calibrates.
#[tokio::test]
async fn the_export_and_relabel_loop_end_to_end() {
    const TOKEN: &str = "desk-token-for-labels";
    let app = TestApp::spawn_with(None, &[("SABI_ADMIN_TOKEN", TOKEN)]).await;
    let t = START_MS / 1000;
    for (n, (customer, text)) in [
        ("2348000000001", "I wan check my balance"),
        ("2348000000002", "I wan talk to human abeg"),
        ("2348000000003", "Who go win the league this year?"),
    ]
    .iter()
    .enumerate()
    {
        let body = text_webhook_at(&format!("wamid.u{n}"), customer, text, t);
        assert_eq!(app.post_whatsapp_webhook(body).await.status(), 200);
    }
    app.clock.advance(Duration::from_secs(20));
    assert_eq!(app.scheduler.drain().await.expect("drain"), 3);

    let desk = |method: reqwest::Method, path: &str| {
        app.client.request(method, app.url(path)).bearer_auth(TOKEN)
    };
    let queue: Value = desk(reqwest::Method::GET, "/admin/review")
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("json");
    let id = queue["items"][0]["id"].as_i64().expect("a review item");
    let intents: Vec<&str> = queue["intents"]
        .as_array()
        .expect("intents")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(intents.contains(&"agent_escalation"), "{intents:?}");
    let label = |id: i64, intent: &str| {
        desk(reqwest::Method::POST, &format!("/admin/review/{id}/label"))
            .json(&serde_json::json!({ "intent": intent }))
            .send()
    };
    assert_eq!(
        label(id, "no_such_intent").await.expect("sent").status(),
        422
    );
    assert_eq!(
        label(9_999, "agent_escalation")
            .await
            .expect("sent")
            .status(),
        404
    );
    assert_eq!(
        label(id, "agent_escalation").await.expect("sent").status(),
        200
    );

    let lines = crate::helpers::json_lines(
        app.dir.path(),
        &["route", "--export-unsure", "--since", "3650d"],
    );
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert_eq!(lines[0]["why"], "labelled");
    assert_eq!(lines[0]["intent"], "agent_escalation");
    assert_eq!(lines[0]["text"], "I wan talk to human abeg");
    assert_eq!(lines[0]["answered_by"], "person");
    let by_text = |text: &str| {
        lines
            .iter()
            .find(|l| l["text"] == text)
            .unwrap_or_else(|| panic!("{text} exported: {lines:?}"))
    };
    let balance = by_text("I wan check my balance");
    assert_eq!(
        (
            &balance["guess"],
            &balance["answered_by"],
            &balance["intent"]
        ),
        (
            &Value::from("check_balance"),
            &Value::from("router"),
            &Value::Null
        )
    );
    assert_eq!(
        by_text("Who go win the league this year?")["answered_by"],
        "agent"
    );

    // Unlabelled lines are skipped, and said so; labelled, every line counts.
    let export = app.dir.path().join("unsure.jsonl");
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&export, text).expect("written");
    let eval = |file: &std::path::Path| {
        sabi_command(app.dir.path())
            .args(["route", "--eval"])
            .arg(file)
            .args(["--folds", "0"])
            .output()
            .expect("sabi route runs")
    };
    let partial = eval(&export);
    assert!(partial.status.success());
    let note = String::from_utf8_lossy(&partial.stderr);
    assert!(note.contains("2 lines without an intent skipped"), "{note}");
    let scored = String::from_utf8_lossy(&partial.stdout);
    assert!(scored.contains("messages            1\n"), "{scored}");
    let labelled: String = lines
        .iter()
        .map(|l| {
            let mut l = l.clone();
            if l["intent"].is_null() {
                let truth = match l["guess"].as_str() {
                    Some("check_balance") => "check_balance",
                    _ => "out_of_scope",
                };
                l["intent"] = Value::from(truth);
            }
            format!("{l}\n")
        })
        .collect();
    std::fs::write(&export, labelled).expect("written");
    let full = eval(&export);
    assert!(full.status.success());
    let scored = String::from_utf8_lossy(&full.stdout);
    assert!(scored.contains("messages            3\n"), "{scored}");
    let calibrated = sabi_command(app.dir.path())
        .args(["route", "--calibrate"])
        .arg(&export)
        .output()
        .expect("sabi route runs");
    assert!(
        calibrated.status.success(),
        "{}",
        String::from_utf8_lossy(&calibrated.stderr)
    );
    assert!(String::from_utf8_lossy(&calibrated.stdout).contains("3 messages"));
}

/// The loop closed: `sabi route --retrain` recalibrates from labelled turns (an export, its
/// blanks labelled) and the bundled messages, shows each file's scores before and after, and
/// writes nothing without --write. Apart from the loop above because it needs no store: it
/// runs once, not on every store.
#[test]
fn retrain_shows_each_files_scores_before_and_after_and_writes_only_when_asked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let export = dir.path().join("unsure.jsonl");
    let lines = [
        (
            "I wan talk to human abeg",
            "agent_escalation",
            "labelled",
            "person",
        ),
        (
            "I wan check my balance",
            "check_balance",
            "unsure",
            "router",
        ),
        (
            "Who go win the league this year?",
            "out_of_scope",
            "unsure",
            "agent",
        ),
    ];
    let text: String = lines
        .iter()
        .map(|(text, intent, why, by)| {
            let line = serde_json::json!({
                "text": text, "intent": intent, "why": why, "answered_by": by,
            });
            format!("{line}\n")
        })
        .collect();
    std::fs::write(&export, text).expect("written");
    let intents = dir.path().join("retrained.toml");
    let retrain = |write: bool| {
        let mut command = sabi_command(dir.path());
        command
            .args(["route", "--retrain"])
            .arg(&export)
            .args(["--folds", "2"]);
        if write {
            command.arg("--write").arg(&intents);
        }
        command.output().expect("sabi route runs")
    };
    let shown = retrain(false);
    let out = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.status.success(),
        "{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    let before = out.find("before:").expect("the table before");
    let after = out.find("after:").expect("the table after");
    assert!(before < after, "{out}");
    assert!(
        out.contains("bundled") && out.contains("unsure.jsonl"),
        "{out}"
    );
    assert!(out.contains("leave-one-file-out"), "{out}");
    assert!(out.contains("nothing written"), "{out}");
    assert!(!intents.exists());
    let written = retrain(true);
    assert!(written.status.success());
    let file = std::fs::read_to_string(&intents).expect("the recalibrated file");
    Router::trained(&file).expect("the recalibrated file loads");
}
