//! A customer's data: export and erasure on request, and their consent.

use async_trait::async_trait;

use super::rules::consent::Choice;
use super::rules::erasure::{Erased, Subject};
use super::rules::review::ReviewState;
use super::{OutboxEntry, RecipientView, Result, StoredItem};
use crate::clock::At;
use crate::domain::ReviewReason;

/// Everything Sabi holds about one customer: what their right of access gives them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CustomerRecord {
    /// What came from them or about them (messages, statuses), in arrival order.
    pub items: Vec<StoredItem>,
    /// Replies to them, Sabi's and people's, with how their sending went, oldest first.
    pub replies: Vec<OutboxEntry>,
    /// Their turns that went to a person, and how each was settled, oldest first.
    pub reviews: Vec<ReviewRecord>,
    /// Broadcasts addressed to them, oldest first.
    pub broadcasts: Vec<BroadcastSend>,
    /// Their latest choice about broadcasts.
    pub consent: Option<Choice>,
}

/// One page of a customer's record: the items and the replies after these (arrival order, ids
/// from the previous page), at most `limit` of each; hand-offs, broadcasts and the choice
/// whole on every page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportPage {
    pub items_after: i64,
    pub replies_after: i64,
    pub limit: usize,
}

impl ExportPage {
    /// The whole record at once.
    pub const ALL: ExportPage = ExportPage {
        items_after: 0,
        replies_after: 0,
        limit: usize::MAX,
    };

    /// What follows `record`, read as this page, or `None` when it was the last.
    pub fn next(&self, record: &CustomerRecord) -> Option<ExportPage> {
        let full = record.items.len() >= self.limit || record.replies.len() >= self.limit;
        full.then(|| ExportPage {
            items_after: record.items.last().map_or(self.items_after, |i| i.seq),
            replies_after: record.replies.last().map_or(self.replies_after, |r| r.id),
            limit: self.limit,
        })
    }
}

/// A hand-off to a person and how it was settled.
#[derive(Debug, Clone, PartialEq)]
pub struct ReviewRecord {
    pub id: i64,
    pub batch_id: i64,
    pub reason: ReviewReason,
    pub state: ReviewState,
    pub error: Option<String>,
    pub created_at: At,
    pub resolved_at: Option<At>,
    /// The person's reply, when they wrote one.
    pub note: Option<String>,
}

/// A broadcast addressed to a customer, and what became of it.
#[derive(Debug, Clone, PartialEq)]
pub struct BroadcastSend {
    pub broadcast_id: i64,
    pub name: String,
    pub template: String,
    pub recipient: RecipientView,
}

/// A customer's data as a whole: everything about them, and forgetting it
/// ([`rules::erasure`](super::rules::erasure) has the rules).
#[async_trait]
pub trait Customers: Send + Sync + 'static {
    /// Everything held about the customer; empty for one Sabi does not know.
    async fn export_customer(&self, subject: &Subject) -> Result<CustomerRecord>;

    /// One page of [`Customers::export_customer`]. A backend that cannot page reads the whole
    /// record and returns the page of it.
    async fn export_page(&self, subject: &Subject, page: ExportPage) -> Result<CustomerRecord> {
        let mut record = self.export_customer(subject).await?;
        record.items.retain(|i| i.seq > page.items_after);
        record.items.truncate(page.limit);
        record.replies.retain(|r| r.id > page.replies_after);
        record.replies.truncate(page.limit);
        Ok(record)
    }

    /// Erases the customer, in one transaction on every backend, and says what it removed,
    /// with the links of its id to others ([`rules::identity`](super::rules::identity)).
    /// Running it again removes nothing more.
    ///
    /// # Errors
    /// [`Error::Busy`](super::Error::Busy) while a turn or a send for them is under way.
    async fn forget_customer(&self, subject: &Subject, now: At) -> Result<Erased>;

    /// Every id of the customer `subject` names, however Meta named them: the key their
    /// conversations are under first, then the other ids linked to it
    /// ([`rules::identity`](super::rules::identity)); the subject's own id alone when it has no
    /// links.
    async fn linked_ids(&self, subject: &Subject) -> Result<Vec<String>>;
}

/// The subject under each of the ids [`Customers::linked_ids`] gives, the key first.
async fn linked(store: &dyn Customers, subject: &Subject) -> Result<Vec<Subject>> {
    Ok(store
        .linked_ids(subject)
        .await?
        .into_iter()
        .map(|customer| Subject {
            channel: subject.channel,
            customer,
        })
        .collect())
}

/// Everything held about a customer named by any of their ids: what is under their key, then
/// under each other id (what was kept before Meta showed the ids to be one customer's).
pub async fn export_linked(store: &dyn Customers, subject: &Subject) -> Result<CustomerRecord> {
    let mut whole = CustomerRecord::default();
    for who in linked(store, subject).await? {
        let record = store.export_customer(&who).await?;
        whole.items.extend(record.items);
        whole.replies.extend(record.replies);
        whole.reviews.extend(record.reviews);
        whole.broadcasts.extend(record.broadcasts);
        whole.consent = whole.consent.or(record.consent);
    }
    whole.items.sort_by_key(|i| i.seq);
    whole.replies.sort_by_key(|r| r.id);
    Ok(whole)
}

/// Forgets a customer named by any of their ids: the other ids first, the key last, so that
/// a forget cut short finds the rest again by any id.
pub async fn forget_linked(store: &dyn Customers, subject: &Subject, now: At) -> Result<Erased> {
    let mut erased = Erased::default();
    for who in linked(store, subject).await?.iter().rev() {
        erased += store.forget_customer(who, now).await?;
    }
    Ok(erased)
}
