//! PURE: how well the router does on a labelled set — accuracy, macro-F1, per-intent precision
//! and recall, how much it answers locally, how often a local answer is wrong, and the
//! confusion matrix. With cross-validation, each fold is routed by a router that learned from
//! the intents file plus the other folds, never from the messages it is scored on.

use std::fmt;

use serde::Deserialize;

use super::{Labelled, OUT_OF_SCOPE, Router, Routing, intents};

/// One labelled message (`{"text": ..., "intent": ...}`; other fields are ignored).
#[derive(Debug, Clone, Deserialize)]
pub struct Sample {
    pub text: String,
    pub intent: String,
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
    /// (text, true intent, routed intent).
    pub mistakes: Vec<(String, String, String)>,
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
        }
    }

    fn add(&mut self, text: &str, truth: &str, routing: &Routing) {
        let index = |label: &str| self.labels.iter().position(|l| l == label);
        let (Some(t), Some(p)) = (index(truth), index(&routing.intent)) else {
            return;
        };
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
            self.local += 1;
            self.wrong_local += usize::from(t != p);
            if t != p {
                self.mistakes
                    .push((text.to_owned(), truth.to_owned(), routing.intent.clone()));
            }
        }
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

    pub fn macro_f1(&self) -> f64 {
        let present: Vec<f64> = (0..self.labels.len())
            .filter(|i| self.per_label(*i).3 > 0)
            .map(|i| self.per_label(i).2)
            .collect();
        present.iter().sum::<f64>() / present.len().max(1) as f64
    }
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// Scores `router` as it is on `samples`.
pub fn evaluate(router: &Router, samples: &[Sample]) -> Report {
    let mut report = Report::new(router.labels());
    for sample in samples {
        report.add(&sample.text, &sample.intent, &router.route(&sample.text));
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
    let folds = folds.max(2);
    let mut report: Option<Report> = None;
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
        let router = Router::from_source(source, &training)?;
        let report = report.get_or_insert_with(|| Report::new(router.labels()));
        for sample in samples.iter().skip(fold).step_by(folds) {
            report.add(&sample.text, &sample.intent, &router.route(&sample.text));
        }
    }
    Ok(report.unwrap_or_else(|| Report::new(Vec::new())))
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
        if !self.mistakes.is_empty() {
            writeln!(f, "\nwrong local answers (true -> routed)")?;
            for (text, truth, routed) in &self.mistakes {
                writeln!(f, "  {truth} -> {routed}: {text}")?;
            }
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
