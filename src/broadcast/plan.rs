//! A broadcast before it is kept: who is left out and why (the audience's own reasons, and the
//! customers who opted out), and what a dry run says it would do. The command line and the
//! admin API both make broadcasts through it.

use std::time::Duration;

use serde::Serialize;

use crate::broadcast::audience::Row;
use crate::clock::millis;
use crate::store::{self, Broadcasts, NewBroadcast, NewRecipient, SkipReason};

/// An audience row as a recipient to keep.
pub fn recipient(row: Row) -> NewRecipient {
    NewRecipient {
        to: row.to,
        params: row.params,
        line: Some(row.line),
        skipped: row.skipped,
    }
}

/// Leaves out the recipients whose customers opted out of broadcasts. A claim checks again
/// before each send, so a customer who opts out later is skipped too.
///
/// # Errors
/// When the store cannot say who opted out.
pub async fn exclude_opted_out(store: &dyn Broadcasts, b: &mut NewBroadcast) -> store::Result<()> {
    let listed: Vec<String> = b
        .recipients
        .iter()
        .filter(|r| r.skipped.is_none())
        .map(|r| r.to.clone())
        .collect();
    let out = store.opted_out(&listed).await?;
    for r in &mut b.recipients {
        if r.skipped.is_none() && out.contains(&r.to) {
            r.skipped = Some((SkipReason::OptedOut, "opted out of broadcasts".to_owned()));
        }
    }
    Ok(())
}

/// What a create would do, with nothing kept.
#[derive(Debug, Serialize)]
pub struct DryRun {
    pub dry_run: bool,
    /// Rows in the audience.
    pub recipients: usize,
    pub to_send: usize,
    pub skipped: Vec<LeftOut>,
    /// How long the sends take at the broadcast's rate.
    pub takes_ms: i64,
    pub rate: u32,
}

#[derive(Debug, Serialize)]
pub struct LeftOut {
    pub line: Option<u64>,
    pub to: String,
    pub reason: SkipReason,
    pub why: String,
}

impl DryRun {
    pub fn of(b: &NewBroadcast) -> DryRun {
        let to_send = b.recipients.iter().filter(|r| r.skipped.is_none()).count();
        let skipped = b
            .recipients
            .iter()
            .filter_map(|r| {
                let (reason, why) = r.skipped.as_ref()?;
                Some(LeftOut {
                    line: r.line,
                    to: r.to.clone(),
                    reason: *reason,
                    why: why.clone(),
                })
            })
            .collect();
        let takes = Duration::from_secs_f64(to_send as f64 / f64::from(b.rate.max(1)));
        DryRun {
            dry_run: true,
            recipients: b.recipients.len(),
            to_send,
            skipped,
            takes_ms: millis(takes),
            rate: b.rate,
        }
    }
}
