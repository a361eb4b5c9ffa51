//! A customer's data: export holds everything about them, and forget leaves only hashes that
//! keep Sabi from taking a retry in or messaging them again (store/rules/erasure.rs).

use std::sync::Arc;

use futures_util::future::join_all;
use sabi::clock::At;
use sabi::domain::{Channel, InboundItem, Quarantined, ReplyPart};
use sabi::store::rules::consent::Source;
use sabi::store::{
    Choice, CustomerRecord, Ending, Erased, Error, InboxQuery, Ingest, RecipientState, SendResult,
    SkipReason, Store, Subject, Submitted, export_linked, forget_linked,
};

use super::broadcasts::{diwali, sends};
use super::fixtures::{claim_only, open_reviews, replied, replied_to, status, turn};
use super::{POLICY, T0, ingest, message, question, reply};
use crate::helpers::ms;

const ADA: &str = "2348031234567";
const BO: &str = "2348030000002";
const SECRET: &str = "my BVN is 22233344455 and my PIN is 4321";

fn whatsapp(customer: &str) -> Subject {
    Subject::parse(Channel::Whatsapp, customer).expect("a number")
}

async fn export(store: &Arc<dyn Store>, who: &Subject) -> CustomerRecord {
    store.export_customer(who).await.expect("export")
}

async fn forget(store: &Arc<dyn Store>, who: &Subject, at: At) -> Erased {
    store.forget_customer(who, at).await.expect("forget")
}

/// Ada wrote a secret, was answered and her reply delivered, opted out, and a raw part that
/// names her was quarantined; Bo wrote too.
async fn ada_and_bo(store: &Arc<dyn Store>) {
    let secret = message("wamid.ada-1", ADA, SECRET, T0);
    let parts = replied_to(
        store,
        secret,
        &["Never share your PIN, Ada."],
        T0 + ms(20_000),
    )
    .await;
    let job = claim_only(store, parts[0], T0 + ms(21_000)).await;
    let accepted = SendResult::Accepted {
        wamid: "wamid.to-ada".into(),
        template: false,
        next_send_at: T0 + ms(21_000),
    };
    store
        .record_send(job.id, job.attempt, T0 + ms(21_000), accepted)
        .await
        .expect("sent");
    let mut delivered = status("wamid.to-ada", "delivered", T0 + ms(22_000));
    delivered.customer = Some(ADA.into());
    let quarantined = Quarantined {
        channel: Channel::Whatsapp,
        reason: "unknown field".into(),
        raw: format!(r#"{{"from":"{ADA}","oddity":true}}"#),
    };
    store
        .ingest(Ingest {
            items: vec![
                delivered,
                message("wamid.bo-1", BO, "hello", T0 + ms(22_000)),
            ],
            quarantined: vec![quarantined],
            received_at: T0 + ms(22_000),
            policy: POLICY,
            routine: Default::default(),
            pair_spacing: std::time::Duration::ZERO,
            human_hold: std::time::Duration::ZERO,
        })
        .await
        .expect("kept");
    let stop = Choice {
        opted_out: true,
        source: Source::Keyword,
        at: T0 + ms(23_000),
    };
    assert!(store.choose(ADA, stop).await.expect("kept"));
}

pub async fn export_holds_everything_and_forget_leaves_only_hashes(store: Arc<dyn Store>) {
    ada_and_bo(&store).await;
    let stats_before = store.turn_stats(At::from_millis(0)).await.expect("stats");
    let ada = whatsapp(ADA);

    let record = export(&store, &ada).await;
    let texts: Vec<Option<&str>> = record
        .items
        .iter()
        .map(|i| i.item.text.as_deref())
        .collect();
    assert_eq!(
        texts,
        [Some(SECRET), None],
        "her message and her reply's status"
    );
    assert_eq!(record.replies.len(), 1);
    assert_eq!(record.replies[0].text, "Never share your PIN, Ada.");
    assert_eq!(record.consent.map(|c| c.opted_out), Some(true));

    let erased = forget(&store, &ada, T0 + ms(30_000)).await;
    assert_eq!(
        erased,
        Erased {
            messages: 1,
            statuses: 1,
            replies: 1,
            quarantined: 1,
            conversations: 1,
            consents: 1,
            ..Erased::default()
        }
    );
    assert_eq!(export(&store, &ada).await, CustomerRecord::default());
    assert_eq!(
        forget(&store, &ada, T0 + ms(31_000)).await,
        Erased::default(),
        "a second forget finds nothing"
    );

    // Nothing anywhere still says what she wrote or was told, or who she is.
    let inbox = format!(
        "{:?}",
        store.inbox(Default::default()).await.expect("inbox")
    );
    let outbox = format!("{:?}", store.outbox(None).await.expect("outbox"));
    let quarantine = format!("{:?}", store.quarantine(None).await.expect("quarantine"));
    for (what, held) in [
        ("inbox", &inbox),
        ("outbox", &outbox),
        ("quarantine", &quarantine),
    ] {
        for word in ["22233344455", "Never share", ADA] {
            assert!(
                !held.contains(word),
                "{word} is still in the {what}: {held}"
            );
        }
    }
    assert!(inbox.contains("hello"), "Bo's message stays");
    assert_eq!(export(&store, &whatsapp(BO)).await.items.len(), 1);
    assert!(
        store
            .conversations(ADA, 10)
            .await
            .expect("conversations")
            .is_empty()
    );
    assert_eq!(
        store.turn_stats(At::from_millis(0)).await.expect("stats"),
        stats_before,
        "the turns still count"
    );

    // Meta's late retry of her message is known: nothing is kept, no turn is due.
    let retry = ingest(
        &store,
        vec![message("wamid.ada-1", ADA, SECRET, T0)],
        T0 + ms(40_000),
    )
    .await;
    assert_eq!((retry.stored, retry.duplicates), (0, 1));
    assert!(export(&store, &ada).await.items.is_empty());
    let due = store
        .claim(T0 + ms(100_000), ms(60_000), 10, None)
        .await
        .expect("claim");
    let customers: Vec<&str> = due
        .iter()
        .map(|c| c.batch.conversation.customer.as_str())
        .collect();
    assert_eq!(customers, [BO], "only Bo's message waits for a turn");

    // And she stays out of broadcasts, though her own opt-out row is gone.
    let out = store
        .opted_out(&[ADA.to_owned(), BO.to_owned()])
        .await
        .expect("read");
    assert_eq!(out.into_iter().collect::<Vec<_>>(), [ADA]);

    // A new message is a new customer's: Sabi answers whoever writes.
    let again = ingest(
        &store,
        vec![message("wamid.ada-2", ADA, "hi again", T0 + ms(200_000))],
        T0 + ms(200_000),
    )
    .await;
    assert_eq!(again.stored, 1);
    assert_eq!(export(&store, &ada).await.items.len(), 1);
}

pub async fn forget_waits_for_work_under_way_for_the_customer(store: Arc<dyn Store>) {
    let ada = whatsapp(ADA);
    ingest(&store, vec![message("wamid.ada-1", ADA, SECRET, T0)], T0).await;
    let at = T0 + POLICY.cap;
    let claims = store.claim(at, ms(60_000), 10, None).await.expect("claim");
    assert!(matches!(
        store.forget_customer(&ada, at).await,
        Err(Error::Busy(_))
    ));
    store
        .finish(claims[0].batch.id, claims[0].token, at, reply("Noted."))
        .await
        .expect("finish");
    let part = store.outbox(None).await.expect("outbox")[0].id;
    let job = claim_only(&store, part, at).await;
    assert!(
        matches!(store.forget_customer(&ada, at).await, Err(Error::Busy(_))),
        "a send on its way"
    );
    let lost = SendResult::Retry {
        at: at + ms(60_000),
        failure: true,
        code: None,
        error: "timed out".into(),
        recipient_after: None,
    };
    store
        .record_send(job.id, job.attempt, at, lost)
        .await
        .expect("recorded");
    let erased = forget(&store, &ada, at + ms(1_000)).await;
    assert_eq!((erased.messages, erased.replies), (1, 1));
    assert!(
        store
            .claim_sends(super::fixtures::sends(at + ms(120_000)))
            .await
            .expect("claim")
            .jobs
            .is_empty(),
        "the queued reply is gone with her"
    );
}

pub async fn a_forgotten_customer_is_sent_no_broadcast(store: Arc<dyn Store>) {
    let (b, _) = store
        .create_broadcast(diwali(None, T0))
        .await
        .expect("kept");
    let erased = forget(&store, &whatsapp(ADA), T0 + ms(1)).await;
    assert!(erased.broadcast_sends >= 1);
    let jobs = store
        .claim_recipients(sends(T0 + ms(2), 10))
        .await
        .expect("claimed");
    let to: Vec<&str> = jobs.iter().map(|j| j.to.as_str()).collect();
    assert_eq!(to, ["2348039999999"]);
    let skipped = store
        .broadcast_recipients(b.id, Some(RecipientState::Skipped), 10)
        .await
        .expect("recipients");
    assert!(skipped.iter().all(|r| r.to != ADA), "her number is gone");
    let hers = skipped
        .iter()
        .find(|r| r.to == crate::helpers::marks().marker(sabi::domain::Channel::Whatsapp, ADA))
        .expect("her send, under the marker");
    assert_eq!(hers.skipped, Some(SkipReason::OptedOut));
    assert!(hers.params.is_empty(), "her name is gone");
}

pub async fn a_forgotten_chat_session_leaves_no_history(store: Arc<dyn Store>) {
    let Submitted::Job(receipt) = store
        .submit_chat(question("s-ada", "job-1"))
        .await
        .expect("kept")
    else {
        panic!("a job");
    };
    let session = Subject::parse(Channel::Webchat, "s-ada").expect("a session");
    assert_eq!(export(&store, &session).await.items.len(), 1);
    let erased = forget(&store, &session, T0 + ms(1)).await;
    assert_eq!((erased.messages, erased.chat_jobs), (1, 1));
    assert!(
        store
            .chat_history("s-ada", None, 10)
            .await
            .expect("history")
            .is_empty()
    );
    assert_eq!(
        store
            .chat_job(&receipt.job_id, T0 + ms(2))
            .await
            .expect("job"),
        None
    );
    assert_eq!(store.chat_queue_depth().await.expect("depth"), 0);
    let again = store.submit_chat(question("s-ada", "job-1")).await;
    assert!(
        matches!(again, Err(Error::NotFound)),
        "the browser sending the erased question again is refused: {again:?}"
    );
}

/// Forgetting one customer while others' messages arrive and turns are claimed takes
/// nothing of theirs: every other message is kept once and claimed once.
pub async fn forget_racing_ingest_and_claims_takes_only_its_customer(store: Arc<dyn Store>) {
    let ada = whatsapp(ADA);
    ingest(&store, vec![message("wamid.ada-1", ADA, SECRET, T0)], T0).await;
    let others: Vec<String> = (0..20).map(|n| format!("23480300001{n:02}")).collect();
    let deliveries = others.iter().enumerate().map(|(n, customer)| {
        let item = message(&format!("wamid.o-{n}"), customer, "price?", T0);
        ingest(&store, vec![item], T0)
    });
    let forgets = (0..3).map(|n| store.forget_customer(&ada, T0 + ms(n)));
    let (_, forgotten) = tokio::join!(join_all(deliveries), join_all(forgets));
    assert!(
        forgotten.iter().all(Result::is_ok),
        "no turn or send was under way: {forgotten:?}"
    );
    let claims = store
        .claim(T0 + POLICY.cap, ms(60_000), 100, None)
        .await
        .expect("claim");
    let mut claimed: Vec<&str> = claims
        .iter()
        .map(|c| c.batch.conversation.customer.as_str())
        .collect();
    claimed.sort_unstable();
    assert_eq!(claimed, others, "each other customer once, Ada not at all");
    assert!(claims.iter().all(|c| c.batch.messages.len() == 1));
    assert!(export(&store, &ada).await.items.is_empty());
}

/// Ids that left the store (a desk link, a reply part's callback data) name one thing for good:
/// forgetting the newest customer frees the highest ids, and the next customer's turn, reply
/// part and review item still get new ones.
pub async fn ids_are_never_given_twice_after_the_newest_customer_is_forgotten(
    store: Arc<dyn Store>,
) {
    replied(&store, BO, &["Hello Bo"], T0).await;
    let ada_parts = replied(&store, ADA, &["Hello Ada"], T0 + ms(60_000)).await;
    let handoff = |text: &str| Ending::Handoff {
        parts: vec![ReplyPart::text(text)],
        sandbox: false,
        note: "asked for a person".into(),
    };
    let hers = message("wamid.ada-2", ADA, "a person please", T0 + ms(120_000));
    let ada_batch = turn(
        &store,
        hers,
        T0 + ms(180_000),
        handoff("A person will reply"),
    )
    .await;
    let ada_review = open_reviews(&store).await[0].id;
    let ada_outbox: Vec<i64> = store
        .outbox(None)
        .await
        .expect("outbox")
        .iter()
        .map(|e| e.id)
        .collect();
    let highest_part = *ada_outbox.iter().max().expect("parts");
    assert!(ada_parts.iter().all(|p| *p <= highest_part));

    forget(&store, &whatsapp(ADA), T0 + ms(240_000)).await;
    assert_eq!(store.review_item(ada_review).await.expect("read"), None);

    let chi = "2348039999999";
    let theirs = message("wamid.chi-1", chi, "a person please", T0 + ms(300_000));
    let chi_batch = turn(
        &store,
        theirs,
        T0 + ms(360_000),
        handoff("A person will reply"),
    )
    .await;
    let chi_review = open_reviews(&store).await[0].id;
    let chi_parts: Vec<i64> = store
        .outbox(None)
        .await
        .expect("outbox")
        .iter()
        .filter(|e| e.batch_id == chi_batch)
        .map(|e| e.id)
        .collect();
    assert!(chi_batch > ada_batch, "batch {chi_batch} after {ada_batch}");
    assert!(
        chi_review > ada_review,
        "review item {chi_review} after {ada_review}"
    );
    assert!(
        chi_parts.iter().all(|p| *p > highest_part),
        "parts {chi_parts:?} after {highest_part}"
    );
}

/// After Ada is forgotten, Meta's late statuses about her reply do not store her number again,
/// and of the quarantined parts only hers is emptied: Bo's, which quotes her number, stays.
pub async fn after_forget_late_statuses_are_known_and_only_her_own_parts_are_emptied(
    store: Arc<dyn Store>,
) {
    ada_and_bo(&store).await;
    let bo_quotes_her = Quarantined {
        channel: Channel::Whatsapp,
        reason: "unknown field".into(),
        raw: format!(r#"{{"from":"{BO}","oddity":"my sister is {ADA}"}}"#),
    };
    store
        .ingest(Ingest {
            items: Vec::new(),
            quarantined: vec![bo_quotes_her.clone()],
            received_at: T0 + ms(24_000),
            policy: POLICY,
            routine: Default::default(),
            pair_spacing: std::time::Duration::ZERO,
            human_hold: std::time::Duration::ZERO,
        })
        .await
        .expect("kept");

    let erased = forget(&store, &whatsapp(ADA), T0 + ms(30_000)).await;
    assert_eq!(erased.quarantined, 1, "her own part only: {erased:?}");
    let raws: Vec<String> = store
        .quarantine(None)
        .await
        .expect("quarantine")
        .into_iter()
        .map(|q| q.quarantined.raw)
        .collect();
    assert_eq!(
        raws,
        [String::new(), bo_quotes_her.raw],
        "Bo's part is intact"
    );

    for (n, delivery) in ["delivered", "read"].into_iter().enumerate() {
        let mut late = status("wamid.to-ada", delivery, T0 + ms(40_000));
        late.customer = Some(ADA.into());
        late.facts["recipient_id"] = ADA.into();
        let receipt = ingest(&store, vec![late], T0 + ms(40_000 + n as u64)).await;
        assert_eq!(
            receipt.stored, 0,
            "a late {delivery} status is a known duplicate"
        );
    }
    let record = export(&store, &whatsapp(ADA)).await;
    assert!(
        record.items.is_empty(),
        "her number is stored nowhere: {record:?}"
    );
}

/// A broadcast reached Ada and she was forgotten: Meta's late statuses about it do not store her
/// number again.
pub async fn a_late_status_about_a_broadcast_to_a_forgotten_customer_is_known(
    store: Arc<dyn Store>,
) {
    store
        .create_broadcast(diwali(None, T0))
        .await
        .expect("kept");
    let jobs = store
        .claim_recipients(sends(T0 + ms(1), 10))
        .await
        .expect("claimed");
    let hers = jobs.iter().find(|j| j.to == ADA).expect("her send");
    let accepted = sabi::store::Outcome::Accepted {
        wamid: "wamid.offer-to-ada".into(),
    };
    store
        .record_recipient(
            hers.id,
            hers.attempt,
            T0 + ms(2),
            accepted,
            super::broadcasts::LIMITS,
        )
        .await
        .expect("sent");
    forget(&store, &whatsapp(ADA), T0 + ms(3)).await;

    let mut late = status("wamid.offer-to-ada", "read", T0 + ms(10_000));
    late.customer = Some(ADA.into());
    let receipt = ingest(&store, vec![late], T0 + ms(10_000)).await;
    assert_eq!(
        receipt.stored, 0,
        "a late status about her broadcast is a known duplicate"
    );
    assert!(export(&store, &whatsapp(ADA)).await.items.is_empty());
}

/// An export read a page at a time holds what the whole export holds, each item and reply once,
/// in order, and another customer's nothing.
pub async fn an_export_comes_a_page_at_a_time(store: Arc<dyn Store>) {
    for n in 0..3i64 {
        let at = T0 + ms(u64::try_from(n).expect("small") * 600_000);
        let item = message(&format!("wamid.page-{n}"), ADA, "hello", at);
        replied_to(&store, item, &["one", "two"], at + ms(20_000)).await;
    }
    replied(&store, BO, &["not Ada's"], T0 + ms(5_000)).await;
    let ada = whatsapp(ADA);
    let whole = export(&store, &ada).await;
    assert_eq!((whole.items.len(), whole.replies.len()), (3, 6));
    let mut page = sabi::store::ExportPage {
        items_after: 0,
        replies_after: 0,
        limit: 2,
    };
    let (mut items, mut replies, mut pages) = (Vec::new(), Vec::new(), 0);
    loop {
        let record = store.export_page(&ada, page).await.expect("page");
        pages += 1;
        assert!(record.items.len() <= 2 && record.replies.len() <= 2);
        items.extend(record.items.iter().map(|i| i.seq));
        replies.extend(record.replies.iter().map(|r| r.id));
        match page.next(&record) {
            Some(next) => page = next,
            None => break,
        }
        assert!(pages < 10, "the pages never end");
    }
    assert_eq!(items, whole.items.iter().map(|i| i.seq).collect::<Vec<_>>());
    assert_eq!(
        replies,
        whole.replies.iter().map(|r| r.id).collect::<Vec<_>>()
    );
    assert_eq!(pages, 4, "three full pages of replies, then an empty one");
}

/// A customer's message as a 2026 webhook gives it: under the number when Meta gave one, else
/// the BSUID; the facts name both.
fn named(id: &str, number: Option<&str>, bsuid: &str, text: &str, at: At) -> InboundItem {
    let mut item = message(id, number.unwrap_or(bsuid), text, at);
    item.facts = serde_json::json!({"id": id, "from": number, "from_user_id": bsuid});
    item
}

/// The texts of a customer's conversations, whichever id names them, and how many there are.
async fn threads(store: &Arc<dyn Store>, customer: &str) -> (usize, Vec<String>) {
    let views = store
        .conversations(customer, 50)
        .await
        .expect("conversations");
    let texts = views
        .iter()
        .flat_map(|v| v.history.iter().map(|h| h.text.clone()))
        .collect();
    (views.len(), texts)
}

pub async fn a_customer_meta_names_by_number_and_bsuid_is_one_customer(store: Arc<dyn Store>) {
    const NUMBER: &str = "2348031111111";
    const BSUID: &str = "NG.5530912874410021";
    // Named by both, then by the BSUID alone (they hid their number): one conversation,
    // under the number.
    let both = named("wamid.id-1", Some(NUMBER), BSUID, "hello", T0);
    turn(&store, both, T0 + ms(20_000), reply("Hi!")).await;
    let alone = named("wamid.id-2", None, BSUID, "my order?", T0 + ms(30_000));
    turn(&store, alone, T0 + ms(50_000), reply("On its way.")).await;
    let (count, texts) = threads(&store, NUMBER).await;
    assert_eq!(count, 1);
    assert_eq!(texts, ["hello", "Hi!", "my order?", "On its way."]);
    assert_eq!(threads(&store, BSUID).await.0, 0, "no second customer");

    // Known by the BSUID first (a username, no number), then by both: under the BSUID.
    const FIRST: &str = "NG.77";
    const LATER: &str = "2348032222222";
    let first = named("wamid.id-3", None, FIRST, "hi", T0 + ms(60_000));
    turn(&store, first, T0 + ms(80_000), reply("Hello.")).await;
    let shown = named("wamid.id-4", Some(LATER), FIRST, "it's me", T0 + ms(90_000));
    turn(&store, shown, T0 + ms(110_000), reply("Welcome back.")).await;
    assert_eq!(threads(&store, FIRST).await.1.len(), 4);
    assert_eq!(threads(&store, LATER).await.0, 0);

    // They change number: the system message names their new BSUID, which then joins too.
    const NEW: &str = "NG.88";
    let mut changed = named("wamid.id-5", None, FIRST, "User changed", T0 + ms(120_000));
    changed.item_type = Some("system".into());
    changed.turn = None;
    changed.facts["system_new_user_id"] = NEW.into();
    ingest(&store, vec![changed], T0 + ms(120_000)).await;
    let fresh = named("wamid.id-6", None, NEW, "new phone", T0 + ms(130_000));
    turn(&store, fresh, T0 + ms(150_000), reply("Noted.")).await;
    let (count, texts) = threads(&store, FIRST).await;
    assert_eq!(
        (count, texts.last().map(String::as_str)),
        (1, Some("Noted."))
    );

    // Export and erasure by any of the ids cover all of them.
    let by_number = whatsapp(LATER);
    let ids = store.linked_ids(&by_number).await.expect("ids");
    assert_eq!(ids, [FIRST, LATER, NEW]);
    assert_eq!(store.linked_ids(&whatsapp(NEW)).await.expect("ids"), ids);
    let record = export_linked(store.as_ref(), &whatsapp(NEW))
        .await
        .expect("export");
    let said: Vec<&str> = record
        .items
        .iter()
        .filter_map(|i| i.item.text.as_deref())
        .collect();
    assert_eq!(said, ["hi", "it's me", "User changed", "new phone"]);
    let erased = forget_linked(store.as_ref(), &by_number, T0 + ms(160_000))
        .await
        .expect("forget");
    assert_eq!((erased.messages, erased.conversations), (4, 1));
    for id in [FIRST, LATER, NEW] {
        assert_eq!(store.linked_ids(&whatsapp(id)).await.expect("ids"), [id]);
        assert_eq!(threads(&store, id).await.0, 0);
    }
    // The first customer is untouched.
    assert_eq!(threads(&store, NUMBER).await.0, 1);
}

/// One customer's deliveries sent at once, more than a store stores in one go (about 100 KB),
/// are kept in the order they were sent: their conversation reads them in that order.
pub async fn a_customers_deliveries_at_once_keep_the_order_sent(store: Arc<dyn Store>) {
    const CUSTOMER: &str = "2348050000999";
    let text = "a long message about my order ".repeat(34);
    let items: Vec<InboundItem> = (0..100)
        .map(|n| message(&format!("wamid.order-{n:03}"), CUSTOMER, &text, T0 + ms(n)))
        .collect();
    join_all(
        items
            .iter()
            .map(|item| ingest(&store, vec![item.clone()], T0 + ms(200))),
    )
    .await;
    let kept = store.inbox(InboxQuery::default()).await.expect("inbox");
    let order: Vec<&str> = kept
        .iter()
        .filter(|stored| stored.item.customer.as_deref() == Some(CUSTOMER))
        .map(|stored| stored.item.dedupe_key.as_str())
        .collect();
    let sent: Vec<&str> = items.iter().map(|item| item.dedupe_key.as_str()).collect();
    assert_eq!(order, sent);
}

/// Deliveries sent at once each hear their own receipt: how many of their own messages were
/// kept or known, and their own conversation's due time (a store may store them together).
pub async fn deliveries_at_once_each_hear_their_own_receipt(store: Arc<dyn Store>) {
    let deliveries: Vec<(At, Vec<InboundItem>)> = (0..48)
        .map(|n| {
            let customer = format!("23480500002{n:02}");
            let items = (0..=n % 4)
                .map(|k| message(&format!("wamid.own-{n}-{k}"), &customer, "hi", T0))
                .collect();
            (T0 + ms(100 * n as u64), items)
        })
        .collect();
    for round in 0..2 {
        let receipts = join_all(
            deliveries
                .iter()
                .map(|(at, items)| ingest(&store, items.clone(), *at)),
        )
        .await;
        for ((at, items), receipt) in deliveries.iter().zip(&receipts) {
            let kept = if round == 0 { items.len() } else { 0 };
            assert_eq!(
                (receipt.stored, receipt.duplicates),
                (kept, items.len() - kept),
                "round {round}, delivery at {at:?}"
            );
            if round == 0 {
                assert_eq!(receipt.earliest_due, Some(*at + POLICY.window), "{at:?}");
            }
        }
    }
}

/// Many customers' messages at once, each delivered twice (the way a busy number's webhooks
/// arrive, and the way stores gather them): every message is kept once, a message named by a
/// BSUID alone joins the conversation of the number it is linked to, a retry of an erased
/// message stays out, and every conversation is due as if its messages came alone.
pub async fn a_wave_of_customers_at_once_is_kept_once_each_under_its_key(store: Arc<dyn Store>) {
    const NUMBER: &str = "2348031111111";
    const BSUID: &str = "NG.5530912874410021";
    let linked = named("wamid.wave-linked", Some(NUMBER), BSUID, "hello", T0);
    ingest(&store, vec![linked], T0).await;
    ingest(&store, vec![message("wamid.wave-ada", ADA, SECRET, T0)], T0).await;
    forget(&store, &whatsapp(ADA), T0 + ms(1)).await;

    let customers: Vec<String> = (0..40).map(|n| format!("23480400001{n:02}")).collect();
    let mut items: Vec<InboundItem> = customers
        .iter()
        .flat_map(|customer| {
            (0..2).map(move |n| {
                let id = format!("wamid.wave-{customer}-{n}");
                message(&id, customer, &format!("m{n}"), T0 + ms(1_000 * n))
            })
        })
        .collect();
    items.push(named(
        "wamid.wave-bsuid",
        None,
        BSUID,
        "my order?",
        T0 + ms(2_000),
    ));
    items.push(message("wamid.wave-ada", ADA, SECRET, T0));
    let copies = items.iter().chain(items.iter());
    let receipts =
        join_all(copies.map(|item| ingest(&store, vec![item.clone()], T0 + ms(5_000)))).await;

    let stored: usize = receipts.iter().map(|r| r.stored).sum();
    let duplicates: usize = receipts.iter().map(|r| r.duplicates).sum();
    assert_eq!(
        (stored, duplicates),
        (81, 83),
        "each once; the erased retry never"
    );
    // A window after the wave, or the cap after the linked customer's first message.
    let mut dues: Vec<At> = receipts.iter().filter_map(|r| r.earliest_due).collect();
    dues.dedup();
    dues.sort_unstable();
    dues.dedup();
    assert_eq!(dues, [T0 + POLICY.cap, T0 + ms(5_000) + POLICY.window]);
    assert_eq!(
        receipts
            .iter()
            .filter(|r| r.earliest_due == Some(T0 + POLICY.cap))
            .count(),
        1
    );
    let claims = store
        .claim(T0 + ms(60_000), ms(1_000), 100, None)
        .await
        .expect("claim");
    let mut batches: Vec<(String, Vec<String>)> = claims
        .iter()
        .map(|c| {
            let texts = c.batch.messages.iter().filter_map(|m| m.text.clone());
            (c.batch.conversation.customer.clone(), texts.collect())
        })
        .collect();
    batches.sort();
    let mut expected: Vec<(String, Vec<String>)> = customers
        .iter()
        .map(|c| (c.clone(), vec!["m0".to_owned(), "m1".to_owned()]))
        .collect();
    expected.push((NUMBER.to_owned(), vec!["hello".into(), "my order?".into()]));
    expected.sort();
    assert_eq!(batches, expected);
    assert!(export(&store, &whatsapp(ADA)).await.items.is_empty());
}
