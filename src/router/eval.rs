//! PURE: how well the router does on a labelled set — accuracy, macro-F1, per-intent precision
//! and recall, how much it answers locally, how often a local answer is wrong, the same per tag
//! (`hard_negative`, `negation`, `multi_intent`, ...), coverage against wrong local answers as
//! the confidence needed rises, and the confusion matrix. With cross-validation, each fold is
//! routed by a router that learned from the intents file plus the other folds, never from the
//! messages it is scored on.
//!
//! Generalisation is measured three ways per file ([`generalisation`]): cross-validated (folds
//! across every file), leave-one-file-out (a router that learned from the other files only,
//! so none of this file's phrasing), and a fixed, seeded hold-out of each file ([`held_out`])
//! that rules are never written from: its mistakes are counted but never listed.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;

use super::{IntentsFile, Labelled, OUT_OF_SCOPE, Router, Routing, intents};

/// One labelled message (`{"text": ..., "intent": ...}`; other fields are ignored).
#[derive(Debug, Clone, Deserialize)]
pub struct Sample {
    /// The message's id in its file (`nr-0001`); the hold-out is drawn from it.
    #[serde(default)]
    pub id: String,
    pub text: String,
    pub intent: String,
    #[serde(default)]
    pub tags: Vec<String>,
}

/// One routed message, as the curve and the tag table read it.
#[derive(Debug, Clone, Copy)]
struct Decision {
    confidence: f32,
    local: bool,
    right: bool,
    out_of_scope: bool,
}

/// Counts of a slice of the set (all messages, or one tag).
#[derive(Debug, Clone, Copy, Default)]
struct Slice {
    total: usize,
    in_scope: usize,
    in_scope_local: usize,
    local: usize,
    wrong_local: usize,
    out_of_scope: usize,
    out_of_scope_to_agent: usize,
}

impl Slice {
    fn add(&mut self, d: Decision) {
        self.total += 1;
        if d.out_of_scope {
            self.out_of_scope += 1;
            self.out_of_scope_to_agent += usize::from(!d.local);
        } else {
            self.in_scope += 1;
            self.in_scope_local += usize::from(d.local);
        }
        if d.local {
            self.local += 1;
            self.wrong_local += usize::from(!d.right);
        }
    }
}

#[derive(Debug, Clone)]
pub struct Report {
    pub labels: Vec<String>,
    /// `confusion[truth][predicted]`, indices into `labels`.
    pub confusion: Vec<Vec<usize>>,
    pub total: usize,
    pub correct: usize,
    /// In-scope messages, and those of them answered locally.
    pub in_scope: usize,
    pub in_scope_local: usize,
    /// Local answers, and those whose intent was wrong.
    pub local: usize,
    pub wrong_local: usize,
    /// Out-of-scope messages, and those sent to the agent.
    pub out_of_scope: usize,
    pub out_of_scope_to_agent: usize,
    /// Messages answered locally with the wrong intent, and out-of-scope ones kept local:
    /// (text, true intent, routed intent and tier).
    /// Held-out messages are left out: rules are not written from them.
    pub mistakes: Vec<(String, String, String)>,
    /// Wrong local answers among held-out messages, counted but not listed.
    pub hidden_mistakes: usize,
    /// Local answers by a pattern (confirmed by the classifier), and the wrong ones.
    pub by_pattern: (usize, usize),
    /// Local answers by the classifier alone, and the wrong ones.
    pub by_classifier: (usize, usize),
    decisions: Vec<Decision>,
    tags: BTreeMap<String, Slice>,
    /// Why in-scope messages went to the agent: fallback reason -> count.
    held_back: BTreeMap<String, usize>,
}

impl Report {
    fn new(labels: Vec<String>) -> Report {
        let n = labels.len();
        Report {
            labels,
            confusion: vec![vec![0; n]; n],
            total: 0,
            correct: 0,
            in_scope: 0,
            in_scope_local: 0,
            local: 0,
            wrong_local: 0,
            out_of_scope: 0,
            out_of_scope_to_agent: 0,
            mistakes: Vec::new(),
            hidden_mistakes: 0,
            by_pattern: (0, 0),
            by_classifier: (0, 0),
            decisions: Vec::new(),
            tags: BTreeMap::new(),
            held_back: BTreeMap::new(),
        }
    }

    fn add(&mut self, sample: &Sample, routing: &Routing) {
        let (text, truth) = (&sample.text, sample.intent.as_str());
        let index = |label: &str| self.labels.iter().position(|l| l == label);
        let (Some(t), Some(p)) = (index(truth), index(&routing.intent)) else {
            return;
        };
        let decision = Decision {
            confidence: routing.confidence,
            local: routing.local,
            right: t == p,
            out_of_scope: truth == OUT_OF_SCOPE,
        };
        self.decisions.push(decision);
        if !decision.out_of_scope && !decision.local {
            let reason = routing
                .fallback
                .map(|f| format!("{f:?}"))
                .unwrap_or_default();
            *self.held_back.entry(reason).or_default() += 1;
        }
        for tag in &sample.tags {
            self.tags.entry(tag.clone()).or_default().add(decision);
        }
        self.confusion[t][p] += 1;
        self.total += 1;
        self.correct += usize::from(t == p);
        if truth == OUT_OF_SCOPE {
            self.out_of_scope += 1;
            self.out_of_scope_to_agent += usize::from(!routing.local);
        } else {
            self.in_scope += 1;
            self.in_scope_local += usize::from(routing.local);
        }
        if routing.local {
            let tier = match routing.tier {
                super::Tier::Classifier => &mut self.by_classifier,
                _ => &mut self.by_pattern,
            };
            tier.0 += 1;
            tier.1 += usize::from(t != p);
            self.local += 1;
            self.wrong_local += usize::from(t != p);
            if t != p && held_out(sample) {
                self.hidden_mistakes += 1;
            } else if t != p {
                let routed = format!("{} [{:?}]", routing.intent, routing.tier);
                self.mistakes.push((text.clone(), truth.to_owned(), routed));
            }
        }
    }

    /// Counts every mistake without listing it: for messages no rule may be written from.
    pub fn seal(&mut self) {
        self.hidden_mistakes += self.mistakes.len();
        self.mistakes.clear();
    }

    pub fn accuracy(&self) -> f64 {
        ratio(self.correct, self.total)
    }

    /// Share of in-scope messages answered locally.
    pub fn local_rate(&self) -> f64 {
        ratio(self.in_scope_local, self.in_scope)
    }

    /// Share of local answers whose intent is wrong.
    pub fn wrong_local_rate(&self) -> f64 {
        ratio(self.wrong_local, self.local)
    }

    pub fn out_of_scope_recall(&self) -> f64 {
        ratio(self.out_of_scope_to_agent, self.out_of_scope)
    }

    /// (precision, recall, f1, support) of label `i`.
    pub fn per_label(&self, i: usize) -> (f64, f64, f64, usize) {
        let tp = self.confusion[i][i];
        let predicted: usize = self.confusion.iter().map(|row| row[i]).sum();
        let support: usize = self.confusion[i].iter().sum();
        let (p, r) = (ratio(tp, predicted), ratio(tp, support));
        let f1 = if p + r > 0.0 {
            2.0 * p * r / (p + r)
        } else {
            0.0
        };
        (p, r, f1, support)
    }

    /// (confidence needed, in-scope answered locally, wrong local, out-of-scope to the agent)
    /// as the confidence a local answer needs rises: what a stricter threshold would give.
    pub fn curve(&self) -> Vec<(f32, f64, f64, f64)> {
        CURVE_STEPS
            .iter()
            .map(|&needed| {
                let mut slice = Slice::default();
                for d in &self.decisions {
                    slice.add(Decision {
                        local: d.local && d.confidence >= needed,
                        ..*d
                    });
                }
                (
                    needed,
                    ratio(slice.in_scope_local, slice.in_scope),
                    ratio(slice.wrong_local, slice.local),
                    ratio(slice.out_of_scope_to_agent, slice.out_of_scope),
                )
            })
            .collect()
    }

    pub fn macro_f1(&self) -> f64 {
        let present: Vec<f64> = (0..self.labels.len())
            .filter(|i| self.per_label(*i).3 > 0)
            .map(|i| self.per_label(i).2)
            .collect();
        present.iter().sum::<f64>() / present.len().max(1) as f64
    }
}

/// The confidences the curve is read at.
const CURVE_STEPS: &[f32] = &[0.0, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95];

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// Scores `router` as it is on `samples`.
pub fn evaluate(router: &Router, samples: &[Sample]) -> Report {
    let mut report = Report::new(router.labels());
    for sample in samples {
        report.add(sample, &router.route(&sample.text));
    }
    report
}

/// K-fold cross-validation: fold `k` holds every sample whose index is `k` modulo `folds`.
///
/// # Errors
/// When the intents file does not build, or a sample's label is not one of its intents.
pub fn cross_validate(
    source: &str,
    samples: &[Sample],
    folds: usize,
) -> Result<Report, intents::Error> {
    let mut reports = cross_validate_each(source, &[samples.to_vec()], folds)?;
    Ok(reports.pop().unwrap_or_else(|| Report::new(Vec::new())))
}

/// Cross-validation over several sets together (folds cut across all of them, so each set's
/// messages are routed by routers that learned from the others too), scored set by set.
///
/// # Errors
/// As [`cross_validate`].
pub fn cross_validate_each(
    source: &str,
    sets: &[Vec<Sample>],
    folds: usize,
) -> Result<Vec<Report>, intents::Error> {
    let mut ways = cross_validate_ways(source, sets, folds, &[])?;
    Ok(ways.swap_remove(0))
}

/// [`cross_validate_each`] scored as learned and again under each of `ways`' thresholds: one
/// list of reports per way, as learned first. Each fold's router learns once.
fn cross_validate_ways(
    source: &str,
    sets: &[Vec<Sample>],
    folds: usize,
    ways: &[IntentsFile],
) -> Result<Vec<Vec<Report>>, intents::Error> {
    let folds = folds.max(2);
    let samples: Vec<(usize, &Sample)> = sets
        .iter()
        .enumerate()
        .flat_map(|(set, samples)| samples.iter().map(move |s| (set, s)))
        .collect();
    let mut reports: Vec<Vec<Report>> = Vec::new();
    for fold in 0..folds {
        let training: Vec<Labelled> = samples
            .iter()
            .enumerate()
            .filter(|(i, _)| i % folds != fold)
            .map(|(_, (_, s))| labelled(s))
            .collect();
        let mut router = Router::from_source(source, &training)?;
        if reports.is_empty() {
            let empty = || sets.iter().map(|_| Report::new(router.labels())).collect();
            reports = (0..=ways.len()).map(|_| empty()).collect();
        }
        each_way(&mut router, ways, |way, router| {
            for (set, sample) in samples.iter().skip(fold).step_by(folds) {
                reports[way][*set].add(sample, &router.route(&sample.text));
            }
        });
    }
    Ok(reports)
}

/// Calls `score` with `router` as it learned (way 0), then under each of `ways`' thresholds
/// in turn (way 1, 2, ...): thresholds decide only what is answered, not what was learned.
fn each_way(router: &mut Router, ways: &[IntentsFile], mut score: impl FnMut(usize, &Router)) {
    score(0, router);
    for (way, file) in ways.iter().enumerate() {
        router.set_thresholds(file);
        score(way + 1, router);
    }
}

fn labelled(sample: &Sample) -> Labelled {
    Labelled {
        text: sample.text.clone(),
        intent: sample.intent.clone(),
    }
}

/// The seed of the hold-out: fixed, so that the same messages stay out every time.
const HOLD_OUT_SEED: &str = "sabi-router-hold-out-2026-12-04";
/// The share of each file held out, in percent.
const HOLD_OUT_PERCENT: u64 = 25;

/// Whether a message is in its file's fixed hold-out: a seeded hash of its id (of its text
/// when it has none) puts a quarter of every file there. Rules are written from the other
/// messages only, so the hold-out scores the rules as well as the learning.
pub fn held_out(sample: &Sample) -> bool {
    use std::hash::Hasher;
    let mut hash = super::vocabulary::Fnv::default();
    hash.write(HOLD_OUT_SEED.as_bytes());
    let key = if sample.id.is_empty() {
        &sample.text
    } else {
        &sample.id
    };
    hash.write(key.as_bytes());
    // FNV's low bits mix poorly on short keys: fold the high half in.
    let h = hash.finish();
    (h ^ (h >> 32)) % 100 < HOLD_OUT_PERCENT
}

/// One file's scores, measured three ways.
#[derive(Debug, Clone)]
pub struct FileScores {
    /// K-fold cross-validation, the folds cut across every file.
    pub cross_validated: Report,
    /// Routed by a router that learned from the other files only.
    pub leave_one_file_out: Report,
    /// The file's hold-out, routed by a router that learned from every file's other messages.
    pub held_out: Report,
}

/// Per file: cross-validated, leave-one-file-out, and on its never-tuned hold-out.
///
/// # Errors
/// As [`cross_validate`].
pub fn generalisation(
    source: &str,
    sets: &[Vec<Sample>],
    folds: usize,
) -> Result<Vec<FileScores>, intents::Error> {
    let mut ways = generalisation_ways(source, sets, folds, &[])?;
    Ok(ways.swap_remove(0))
}

/// [`generalisation`] scored as learned and again under each of `ways`' thresholds: one list
/// per way, as learned first. Every router learns once.
fn generalisation_ways(
    source: &str,
    sets: &[Vec<Sample>],
    folds: usize,
    ways: &[IntentsFile],
) -> Result<Vec<Vec<FileScores>>, intents::Error> {
    let cross_validated = cross_validate_ways(source, sets, folds, ways)?;
    let tuning: Vec<Labelled> = sets
        .iter()
        .flatten()
        .filter(|s| !held_out(s))
        .map(labelled)
        .collect();
    let mut tuned = Router::from_source(source, &tuning)?;
    let hold_outs: Vec<Vec<Sample>> = sets
        .iter()
        .map(|set| set.iter().filter(|s| held_out(s)).cloned().collect())
        .collect();
    let mut held: Vec<Vec<Report>> = vec![Vec::new(); ways.len() + 1];
    each_way(&mut tuned, ways, |way, router| {
        held[way] = hold_outs.iter().map(|h| evaluate(router, h)).collect();
    });
    let mut left_out: Vec<Vec<Report>> = vec![Vec::new(); ways.len() + 1];
    for i in 0..sets.len() {
        let others: Vec<Labelled> = sets
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .flat_map(|(_, s)| s.iter().map(labelled))
            .collect();
        let mut router = Router::from_source(source, &others)?;
        each_way(&mut router, ways, |way, router| {
            left_out[way].push(evaluate(router, &sets[i]));
        });
    }
    Ok(cross_validated
        .into_iter()
        .zip(left_out)
        .zip(held)
        .map(|((cross_validated, left_out), held)| {
            cross_validated
                .into_iter()
                .zip(left_out)
                .zip(held)
                .map(
                    |((cross_validated, leave_one_file_out), held_out)| FileScores {
                        cross_validated,
                        leave_one_file_out,
                        held_out,
                    },
                )
                .collect()
        })
        .collect())
}

/// A recalibration from labelled turns: the per-file scores before and after, and the
/// intents file it would write.
#[derive(Debug, Clone)]
pub struct Retrained {
    pub before: Vec<FileScores>,
    pub after: Vec<FileScores>,
    pub thresholds: Vec<Thresholds>,
    /// `source` with the new thresholds.
    pub source: String,
}

/// Recalibrates `source`'s thresholds on every set's messages outside the hold-out (the
/// bundled ones and the exported, labelled turns), and scores each set before and after.
/// Nothing is written: the caller shows both tables first.
///
/// # Errors
/// As [`cross_validate`], and when the recalibrated file would not load.
pub fn retrain(
    source: &str,
    sets: &[Vec<Sample>],
    folds: usize,
    max_wrong: f64,
) -> Result<Retrained, intents::Error> {
    let tuning: Vec<Sample> = sets
        .iter()
        .flatten()
        .filter(|s| !held_out(s))
        .cloned()
        .collect();
    let thresholds = calibrate(source, &tuning, folds, max_wrong)?;
    let retrained = with_thresholds(source, &thresholds)?;
    let mut ways = generalisation_ways(source, sets, folds, &[IntentsFile::parse(&retrained)?])?;
    let after = ways.pop().unwrap_or_default();
    let before = ways.pop().unwrap_or_default();
    Ok(Retrained {
        before,
        after,
        thresholds,
        source: retrained,
    })
}

/// One row of the per-file table: (what it counts, out of how many) in a report.
type Measure = fn(&Report) -> (usize, usize);

/// The three figures of a per-file table, each a count of its whole: wrong local answers,
/// out-of-scope messages to the agent, in-scope messages answered locally.
const MEASURES: [(&str, Measure); 3] = [
    ("wrong local", |r| (r.wrong_local, r.local)),
    ("out_of_scope->agent", |r| {
        (r.out_of_scope_to_agent, r.out_of_scope)
    }),
    ("answered locally", |r| (r.in_scope_local, r.in_scope)),
];

/// `a/b` as a percentage with its counts.
fn percent(a: usize, b: usize) -> String {
    format!("{:.1} % {a}/{b}", 100.0 * ratio(a, b))
}

/// The per-file table of [`generalisation`]: each of `MEASURES` measured three ways.
pub fn generalisation_table(files: &[(String, &FileScores)]) -> String {
    let mut out = format!(
        "{:<18} {:<20} {:>18} {:>20} {:>18}\n",
        "file", "", "cross-validated", "leave-one-file-out", "hold-out"
    );
    for (file, s) in files {
        let reports = [&s.cross_validated, &s.leave_one_file_out, &s.held_out];
        for (i, (name, of)) in MEASURES.iter().enumerate() {
            let [a, b, c] = reports.map(|r| {
                let (a, b) = of(r);
                percent(a, b)
            });
            let file = if i == 0 { file.as_str() } else { "" };
            out.push_str(&format!("{file:<18} {name:<20} {a:>18} {b:>20} {c:>18}\n"));
        }
    }
    out
}

/// One row per file for a router scored as configured, then the files summed: each of
/// `MEASURES`.
pub fn summary_table(files: &[(String, &Report)]) -> String {
    let width = files.iter().map(|(f, _)| f.len()).max().unwrap_or(0).max(5);
    let row = |file: &str, messages: usize, counts: [(usize, usize); 3]| {
        let [a, b, c] = counts.map(|(a, b)| percent(a, b));
        format!("{file:<width$} {messages:>8} {a:>18} {b:>20} {c:>18}\n")
    };
    let [w, o, l] = MEASURES.map(|(name, _)| name);
    let mut out = format!(
        "{:<width$} {:>8} {w:>18} {o:>20} {l:>18}\n",
        "file", "messages"
    );
    let (mut total, mut messages) = ([(0, 0); 3], 0);
    for (file, report) in files {
        let counts = MEASURES.map(|(_, of)| of(report));
        out.push_str(&row(file, report.total, counts));
        messages += report.total;
        for (t, (a, b)) in total.iter_mut().zip(counts) {
            *t = (t.0 + a, t.1 + b);
        }
    }
    out.push_str(&row("total", messages, total));
    out
}

/// `a/b` with its share, or `-` for an empty slice.
fn share(a: usize, b: usize) -> String {
    if b == 0 {
        "-".into()
    } else {
        format!("{:.2} {a}/{b}", ratio(a, b))
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "messages            {}", self.total)?;
        writeln!(f, "accuracy            {:.3}", self.accuracy())?;
        writeln!(f, "macro-F1            {:.3}", self.macro_f1())?;
        writeln!(
            f,
            "answered locally    {:.3} of in-scope messages ({}/{})",
            self.local_rate(),
            self.in_scope_local,
            self.in_scope
        )?;
        writeln!(
            f,
            "wrong local         {:.3} of local answers ({}/{})",
            self.wrong_local_rate(),
            self.wrong_local,
            self.local
        )?;
        writeln!(
            f,
            "local by tier       pattern {} ({} wrong), classifier alone {} ({} wrong)",
            self.by_pattern.0, self.by_pattern.1, self.by_classifier.0, self.by_classifier.1
        )?;
        writeln!(
            f,
            "out_of_scope->agent {:.3} ({}/{})",
            self.out_of_scope_recall(),
            self.out_of_scope_to_agent,
            self.out_of_scope
        )?;
        writeln!(
            f,
            "\n{:<20} {:>9} {:>7} {:>6} {:>8}",
            "intent", "precision", "recall", "f1", "support"
        )?;
        for (i, label) in self.labels.iter().enumerate() {
            let (p, r, f1, n) = self.per_label(i);
            writeln!(f, "{label:<20} {p:>9.3} {r:>7.3} {f1:>6.3} {n:>8}")?;
        }
        let reasons: Vec<String> = self
            .held_back
            .iter()
            .map(|(reason, n)| format!("{reason} {n}"))
            .collect();
        writeln!(f, "in scope, to agent  {}", reasons.join(", "))?;
        writeln!(
            f,
            "\n{:<20} {:>7} {:>12} {:>12} {:>12}",
            "tag", "messages", "local", "wrong local", "oos->agent"
        )?;
        for (tag, s) in &self.tags {
            writeln!(
                f,
                "{tag:<20} {:>7} {:>12} {:>12} {:>12}",
                s.total,
                share(s.in_scope_local, s.in_scope),
                share(s.wrong_local, s.local),
                share(s.out_of_scope_to_agent, s.out_of_scope),
            )?;
        }
        writeln!(
            f,
            "\n{:<20} {:>12} {:>12} {:>12}",
            "confidence needed", "local", "wrong local", "oos->agent"
        )?;
        for (needed, local, wrong, oos) in self.curve() {
            writeln!(f, "{needed:<20.2} {local:>12.3} {wrong:>12.3} {oos:>12.3}")?;
        }
        if !self.mistakes.is_empty() {
            writeln!(f, "\nwrong local answers (true -> routed)")?;
            for (text, truth, routed) in &self.mistakes {
                writeln!(f, "  {truth} -> {routed}: {text}")?;
            }
        }
        if self.hidden_mistakes > 0 {
            writeln!(
                f,
                "  and {} in the hold-out or a sealed file, not shown (rules are never written from them)",
                self.hidden_mistakes
            )?;
        }
        writeln!(
            f,
            "\nconfusion (rows: truth, columns: predicted, in the order above)"
        )?;
        for (i, row) in self.confusion.iter().enumerate() {
            let cells: Vec<String> = row.iter().map(|n| format!("{n:>3}")).collect();
            writeln!(f, "{:<20} {}", self.labels[i], cells.join(""))?;
        }
        Ok(())
    }
}

/// Per intent, the classifier probabilities a local answer needs: `confirm` for a pattern's
/// match, `threshold` for the classifier alone.
#[derive(Debug, Clone, PartialEq)]
pub struct Thresholds {
    pub intent: String,
    pub confirm: f32,
    pub threshold: f32,
    /// Cross-validated local answers at these thresholds, and the wrong ones among them.
    pub local: usize,
    pub wrong: usize,
}

/// The all-intent floor is read at this many times the target: at the target itself it held
/// every intent to the hardest ones, costing a tenth of the local answers on held-back messages
/// for no fewer wrong ones (tests/it/router.rs, `thresholds_calibrated_on_some_messages_hold_on_others`).
const FLOOR_LEEWAY: f64 = 3.0;

/// The candidate thresholds, lowest first.
const GRID: &[f32] = &[
    0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8,
    0.85, 0.9, 0.93, 0.95, 0.97, 0.99, 1.0,
];

/// Thresholds that keep wrong local answers within `max_wrong` of local answers, chosen from
/// K-fold cross-validated decisions of a router with no thresholds: for each intent and tier,
/// the lowest probability above which at most `floor(max_wrong × n)` of its `n` local answers
/// were wrong. An intent with no right answers by a tier gets 1 (in effect: never by that tier).
/// No `confirm` goes below the intent's `confirm_floor`.
///
/// # Errors
/// As [`cross_validate`].
pub fn calibrate(
    source: &str,
    samples: &[Sample],
    folds: usize,
    max_wrong: f64,
) -> Result<Vec<Thresholds>, intents::Error> {
    let folds = folds.max(2);
    let floors: BTreeMap<String, f32> = intents::IntentsFile::parse(source)?
        .intents
        .into_iter()
        .map(|i| (i.name, i.confirm_floor))
        .collect();
    // (routed intent, by a pattern?, evidence, right)
    let mut seen: Vec<(String, bool, f32, bool)> = Vec::new();
    let mut labels = Vec::new();
    for fold in 0..folds {
        let training: Vec<Labelled> = samples
            .iter()
            .enumerate()
            .filter(|(i, _)| i % folds != fold)
            .map(|(_, s)| Labelled {
                text: s.text.clone(),
                intent: s.intent.clone(),
            })
            .collect();
        let router = Router::from_source(source, &training)?.without_thresholds();
        labels = router.labels();
        for sample in samples.iter().skip(fold).step_by(folds) {
            let routing = router.route(&sample.text);
            if routing.local {
                seen.push((
                    routing.intent.clone(),
                    routing.tier == super::Tier::Pattern,
                    routing.confidence,
                    routing.intent == sample.intent,
                ));
            }
        }
    }
    let of = |intent: Option<&str>, pattern: bool| -> Vec<(f32, bool)> {
        seen.iter()
            .filter(|(i, p, _, _)| intent.is_none_or(|intent| i == intent) && *p == pattern)
            .map(|(_, _, e, r)| (*e, *r))
            .collect()
    };
    // An intent has a few dozen answers: its own thresholds alone would fit their noise. The
    // thresholds of all intents together (hundreds of answers) are a floor under them.
    let floor_confirm = lowest_within(&of(None, true), max_wrong * FLOOR_LEEWAY).0;
    let floor_threshold = lowest_within(&of(None, false), max_wrong * FLOOR_LEEWAY).0;
    Ok(labels
        .into_iter()
        .filter(|l| l != OUT_OF_SCOPE)
        .map(|intent| {
            let kept = |pattern: bool, floor: f32| {
                let answers = of(Some(&intent), pattern);
                let own = lowest_within(&answers, max_wrong).0.max(floor);
                let kept: Vec<&(f32, bool)> = answers.iter().filter(|(e, _)| *e >= own).collect();
                (own, kept.len(), kept.iter().filter(|(_, r)| !*r).count())
            };
            let hand_floor = floors.get(&intent).copied().unwrap_or(0.0);
            let (confirm, by_pattern, wrong_by_pattern) = kept(true, floor_confirm.max(hand_floor));
            let (threshold, by_classifier, wrong_by_classifier) = kept(false, floor_threshold);
            Thresholds {
                intent,
                confirm,
                threshold,
                local: by_pattern + by_classifier,
                wrong: wrong_by_pattern + wrong_by_classifier,
            }
        })
        .collect())
}

/// The lowest threshold of the grid whose kept answers are wrong at most `max_wrong` of the
/// time (rounded down: few answers must all be right), and (kept, wrong) at it.
fn lowest_within(answers: &[(f32, bool)], max_wrong: f64) -> (f32, (usize, usize)) {
    for &threshold in GRID {
        let kept: Vec<bool> = answers
            .iter()
            .filter(|(e, _)| *e >= threshold)
            .map(|(_, right)| *right)
            .collect();
        let wrong = kept.iter().filter(|r| !**r).count();
        if !kept.is_empty() && wrong <= (max_wrong * kept.len() as f64).floor() as usize {
            return (threshold, (kept.len(), wrong));
        }
    }
    (GRID[GRID.len() - 1], (0, 0))
}

/// `source` with each intent's `threshold` and `confirm` set to `thresholds`, everything else
/// (comments, order, other settings) as it was.
///
/// # Errors
/// When the result would not load (the file is then left for a person to edit).
pub fn with_thresholds(source: &str, thresholds: &[Thresholds]) -> Result<String, intents::Error> {
    let lines: Vec<&str> = source.lines().collect();
    let header = |line: &str| line.starts_with('[');
    let mut out: Vec<String> = Vec::with_capacity(lines.len() + thresholds.len());
    let mut at = 0;
    while at < lines.len() {
        let line = lines[at];
        if !(header(line) && line.trim_start().starts_with("[[intent]]")) {
            out.push(line.to_owned());
            at += 1;
            continue;
        }
        // The intent's block runs to the next table header.
        let end = (at + 1..lines.len())
            .find(|&j| header(lines[j]))
            .unwrap_or(lines.len());
        let block = &lines[at..end];
        let calibrated = block
            .iter()
            .find_map(|l| string_value(l, "name"))
            .and_then(|name| thresholds.iter().find(|t| t.intent == name));
        for l in block {
            match (key_of(l), calibrated) {
                ("threshold" | "confirm", Some(_)) => {}
                ("name", Some(t)) => {
                    out.push((*l).to_owned());
                    // Shortest exact form, with its point (1.0): a confirm held at a floor such as 0.655
                    // must not be written as 0.65, below the floor the file is refused for.
                    out.push(format!("threshold = {:?}", t.threshold));
                    out.push(format!("confirm = {:?}", t.confirm));
                }
                _ => out.push((*l).to_owned()),
            }
        }
        at = end;
    }
    let mut text = out.join("\n");
    text.push('\n');
    intents::IntentsFile::parse(&text)?;
    Ok(text)
}

/// The key of a `key = value` line.
fn key_of(line: &str) -> &str {
    line.split_once('=').map_or("", |(key, _)| key.trim())
}

/// The string value of a `key = "value"` (or `'value'`) line.
fn string_value<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let (k, value) = line.split_once('=')?;
    if k.trim() != key {
        return None;
    }
    let value = value.trim();
    let quote = value.chars().next().filter(|c| *c == '"' || *c == '\'')?;
    value[1..].split(quote).next()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Thresholds decide only what is answered: a router scored under new thresholds without
    /// learning again scores as one that learned with them.
    #[test]
    fn a_recalibration_scores_as_a_router_that_learned_with_its_thresholds() {
        let source = crate::config::DEFAULT_INTENTS;
        let samples: Vec<Sample> = Router::bundled_samples().into_iter().step_by(40).collect();
        let sets = vec![samples[..120].to_vec(), samples[120..].to_vec()];
        let raised: Vec<Thresholds> = IntentsFile::parse(source)
            .expect("intents")
            .intents
            .into_iter()
            .map(|i| Thresholds {
                intent: i.name,
                confirm: 0.9,
                threshold: 0.95,
                local: 0,
                wrong: 0,
            })
            .collect();
        let raised = with_thresholds(source, &raised).expect("written");
        let ways = [IntentsFile::parse(&raised).expect("intents")];
        let scored = generalisation_ways(source, &sets, 2, &ways).expect("scored");
        let table = |scores: &[FileScores]| {
            generalisation_table(&[("a".into(), &scores[0]), ("b".into(), &scores[1])])
        };
        let learned = |source: &str| table(&generalisation(source, &sets, 2).expect("scored"));
        assert_eq!(table(&scored[0]), learned(source));
        assert_eq!(table(&scored[1]), learned(&raised));
        assert_ne!(
            scored[0][0].cross_validated.local,
            scored[1][0].cross_validated.local
        );
    }
}
