//! What the web chat serves beyond submitting: a session's history with its answers, the jobs
//! of its messages, and the queue's depth.

use std::sync::Arc;

use sabi::clock::At;
use sabi::domain::ReplyPart;
use sabi::store::{
    ChatExchange, ChatSubmission, Ending, JobStatus, Resolution, ReviewState, Store, Submitted,
};

use super::fixtures::open_reviews;
use super::{HUMAN_HOLD, T0, ingest, message, question};

use crate::helpers::ms;

/// Question `message_id` of session `s1`, asked at `now`, with job `job`.
async fn ask(store: &Arc<dyn Store>, job: &str, message_id: &str, text: &str, now: At) -> bool {
    let submission = ChatSubmission {
        message_id: Some(message_id.into()),
        question: text.into(),
        now,
        ..question("s1", job)
    };
    match store.submit_chat(submission).await.expect("submitted") {
        Submitted::Job(receipt) => receipt.job_id == job && receipt.created,
        refused => panic!("within the limits: {refused:?}"),
    }
}

/// Claims the one due web-chat turn at `now` and ends it so.
async fn answer(store: &Arc<dyn Store>, now: At, ending: Ending) {
    let claims = store.claim(now, ms(60_000), 10, None).await.expect("claim");
    assert_eq!(claims.len(), 1, "one question due");
    let claim = &claims[0];
    store
        .finish(claim.batch.id, claim.token, now, ending)
        .await
        .expect("finish");
}

fn exchange(
    job: &str,
    question: &str,
    status: JobStatus,
    answer: Option<&str>,
    at: At,
) -> ChatExchange {
    ChatExchange {
        cursor: 0,
        job_id: job.into(),
        question: question.into(),
        answer: answer.map(str::to_owned),
        status,
        asked_at: at,
    }
}

/// Session s1 asks three questions: the first is answered in two parts, the second handed to a
/// person, the third goes to that person (who holds the chat while the item is open). Sessions
/// s2 and s3 ask one each, which wait in turn. A WhatsApp message arrives meanwhile.
async fn three_questions(store: &Arc<dyn Store>) {
    let depth = || async { store.chat_queue_depth().await.expect("depth") };
    assert!(ask(store, "j1", "m1", "Where is my order?", T0).await);
    assert_eq!(depth().await, 1);
    let two_parts = Ending::Replied {
        parts: vec![
            ReplyPart::text("It ships today."),
            ReplyPart {
                options: vec!["No, thanks".into(), "Yes".into()],
                ..ReplyPart::text("Anything else?")
            },
        ],
        sandbox: false,
    };
    answer(store, T0, two_parts).await;
    let first = store.chat_job("j1", T0 + ms(1)).await.expect("job");
    let first = first.expect("kept");
    assert_eq!(
        first.options,
        ["No, thanks", "Yes"],
        "the last part's choices"
    );
    assert_eq!(depth().await, 0, "a question in its turn waits no more");
    assert!(ask(store, "j2", "m2", "Can I talk to someone?", T0 + ms(10)).await);
    let handoff = Ending::Handoff {
        parts: vec![ReplyPart::text("A colleague will answer.")],
        sandbox: false,
        note: "asked for a person".into(),
    };
    answer(store, T0 + ms(10), handoff).await;
    let elsewhere = ChatSubmission {
        message_id: Some("m1".into()),
        now: T0 + ms(20),
        ..question("s2", "s2-j1")
    };
    store.submit_chat(elsewhere).await.expect("submitted");
    let third_session = ChatSubmission {
        message_id: Some("m1".into()),
        now: T0 + ms(25),
        ..question("s3", "s3-j1")
    };
    store.submit_chat(third_session).await.expect("submitted");
    assert!(ask(store, "j3", "m3", "Hello?", T0 + ms(30)).await);
    ingest(
        store,
        vec![message("wamid.wc1", "c1", "hi", T0)],
        T0 + ms(31),
    )
    .await;
    assert_eq!(depth().await, 2, "web-chat questions for a turn only");
}

pub async fn chat_history_and_queue_depth_follow_each_question(store: Arc<dyn Store>) {
    three_questions(&store).await;
    let waiting = store.chat_job("s3-j1", T0 + ms(31)).await.expect("job");
    let waiting = waiting.expect("kept");
    assert_eq!(
        (waiting.status, waiting.position),
        (JobStatus::Queued, Some(1))
    );
    let history = |limit| {
        let store = store.clone();
        async move {
            let history = store.chat_history("s1", None, limit).await;
            // Cursors are the backend's own: compared by the pages they give (below).
            let history = history.expect("history").into_iter();
            history
                .map(|e| ChatExchange { cursor: 0, ..e })
                .collect::<Vec<_>>()
        }
    };
    let first = exchange(
        "j1",
        "Where is my order?",
        JobStatus::Finished,
        Some("It ships today.\n\nAnything else?"),
        T0,
    );
    let asked = "Can I talk to someone?";
    let handed = exchange("j2", asked, JobStatus::Failed, None, T0 + ms(10));
    let third = exchange("j3", "Hello?", JobStatus::Failed, None, T0 + ms(30));
    assert_eq!(history(10).await, [first, handed.clone(), third.clone()]);
    assert_eq!(history(2).await, [handed, third.clone()]);
    assert_eq!(history(0).await, []);
    // A person answers the hand-off: the question is answered by its whole batch's reply.
    let item = open_reviews(&store).await.remove(0);
    let person = Resolution::Reply {
        text: "Here I am.".into(),
        sandbox: false,
        hold: HUMAN_HOLD,
        desk: None,
    };
    store
        .resolve_review(item.id, T0 + ms(40), person)
        .await
        .expect("replied");
    let both = "A colleague will answer.\n\nHere I am.";
    let answered = exchange("j2", asked, JobStatus::Finished, Some(both), T0 + ms(10));
    let third = exchange("j3", "Hello?", JobStatus::Finished, Some(both), T0 + ms(30));
    assert_eq!(history(2).await, [answered, third]);
    let job = store.chat_job("j2", T0 + ms(41)).await.expect("job");
    let job = job.expect("kept");
    assert_eq!(
        (job.status, job.answer.as_deref()),
        (JobStatus::Finished, Some(both))
    );
    jobs_are_found_by_their_session_and_message(&store, 2).await;
}

/// A message's job is its session's: the same message id in another session is another job,
/// and a resend gives the first job and stores nothing.
async fn jobs_are_found_by_their_session_and_message(store: &Arc<dyn Store>, depth: u64) {
    let found = |session: &'static str, message: &'static str| {
        let store = store.clone();
        async move {
            let job = store.chat_job_for_message(session, message).await;
            job.expect("lookup")
        }
    };
    assert_eq!(found("s1", "m2").await.as_deref(), Some("j2"));
    assert_eq!(found("s2", "m1").await.as_deref(), Some("s2-j1"));
    assert_eq!(found("s2", "m2").await, None);
    assert_eq!(found("s1", "m9").await, None);
    let resend = ChatSubmission {
        message_id: Some("m3".into()),
        question: "Hello?".into(),
        now: T0 + ms(50),
        ..question("s1", "j3-again")
    };
    let receipt = store.submit_chat(resend).await.expect("submitted");
    let Submitted::Job(receipt) = receipt else {
        panic!("a resend is never refused: {receipt:?}");
    };
    assert_eq!((receipt.job_id.as_str(), receipt.created), ("j3", false));
    assert_eq!(store.chat_queue_depth().await.expect("depth"), depth);
}

pub async fn a_sessions_history_is_in_the_order_asked(store: Arc<dyn Store>) {
    // Asked through two nodes whose clocks disagree: the second node is 4 s behind.
    assert!(ask(&store, "j1", "m1", "first", T0 + ms(5_000)).await);
    assert!(ask(&store, "j2", "m2", "second", T0 + ms(1_000)).await);
    let history = store.chat_history("s1", None, 10).await.expect("history");
    let asked: Vec<_> = history
        .iter()
        .map(|e| (e.question.as_str(), e.asked_at))
        .collect();
    assert_eq!(
        asked,
        [("first", T0 + ms(5_000)), ("second", T0 + ms(1_000))]
    );
    let last = store.chat_history("s1", None, 1).await.expect("history");
    assert_eq!(last[0].question, "second", "the last asked");
}

/// A person answering a chat holds it: the item stays open, the visitor's next question joins
/// it (no turn, not queued), people's replies read back in order after an id, and once the
/// person closes the item the next question is a turn again.
pub async fn a_visitor_talks_to_the_person_holding_their_chat(store: Arc<dyn Store>) {
    assert!(ask(&store, "j1", "m1", "A person, please", T0).await);
    let handoff = Ending::Handoff {
        parts: vec![ReplyPart::text("A colleague will answer.")],
        sandbox: false,
        note: "asked for a person".into(),
    };
    answer(&store, T0, handoff).await;
    let feed = |after, limit| {
        let store = store.clone();
        async move { store.chat_feed("s1", after, limit).await.expect("feed") }
    };
    let waiting = feed(0, 10).await;
    assert_eq!(
        (waiting.held, waiting.lines.len()),
        (true, 0),
        "held, and the hand-off's own words are not a person's"
    );
    let item = open_reviews(&store).await.remove(0);
    let says = |text: &str| Resolution::Reply {
        text: text.into(),
        sandbox: false,
        hold: HUMAN_HOLD,
        desk: None,
    };
    store
        .resolve_review(item.id, T0 + ms(10), says("Ada here."))
        .await
        .expect("replied");
    let still = store
        .review_item(item.id)
        .await
        .expect("item")
        .expect("kept");
    assert_eq!(still.state, ReviewState::Open, "the person holds the chat");
    let first = feed(0, 10).await;
    assert!(first.held);
    assert_eq!(first.lines.len(), 1);
    assert_eq!(
        (first.lines[0].text.as_str(), first.lines[0].at),
        ("Ada here.", T0 + ms(10))
    );

    assert!(ask(&store, "j2", "m2", "My order 1234 never came", T0 + ms(20)).await);
    assert_eq!(store.chat_queue_depth().await.expect("depth"), 0);
    let claims = store.claim(T0 + ms(60_000), ms(60_000), 10, None).await;
    assert!(claims.expect("claim").is_empty(), "no turn for it");
    let held = store
        .review_item(item.id)
        .await
        .expect("item")
        .expect("kept");
    let texts: Vec<_> = held
        .messages
        .iter()
        .filter_map(|m| m.text.as_deref())
        .collect();
    assert_eq!(texts, ["A person, please", "My order 1234 never came"]);
    assert_eq!(open_reviews(&store).await.len(), 1);
    let job = store.chat_job("j2", T0 + ms(21)).await.expect("job");
    assert_eq!(
        job.expect("kept").status,
        JobStatus::Failed,
        "with the person"
    );

    store
        .resolve_review(item.id, T0 + ms(30), says("Found it: it ships today."))
        .await
        .expect("replied again");
    let after_first = feed(first.lines[0].id, 10).await;
    let texts: Vec<_> = after_first.lines.iter().map(|l| l.text.as_str()).collect();
    assert_eq!(texts, ["Found it: it ships today."]);
    assert_eq!(feed(0, 1).await.lines, first.lines, "oldest first, limited");
    let job = store.chat_job("j2", T0 + ms(31)).await.expect("job");
    assert_eq!(job.expect("kept").status, JobStatus::Finished);

    store
        .resolve_review(item.id, T0 + ms(40), Resolution::Close)
        .await
        .expect("closed");
    assert!(!feed(0, 10).await.held, "the person left");
    assert!(ask(&store, "j3", "m3", "One more thing", T0 + ms(50)).await);
    assert_eq!(store.chat_queue_depth().await.expect("depth"), 1);
    answer(
        &store,
        T0 + ms(50),
        Ending::Replied {
            parts: vec![ReplyPart::text("Sure.")],
            sandbox: false,
        },
    )
    .await;
    let elsewhere = store.chat_feed("s2", 0, 10).await.expect("feed");
    assert_eq!((elsewhere.held, elsewhere.lines.len()), (false, 0));
}

/// A history reads a page at a time: the latest first, then those before a cursor, with no
/// exchange twice and none left out.
pub async fn a_sessions_history_pages_back_by_its_cursor(store: Arc<dyn Store>) {
    for n in 0..5 {
        let text = format!("question {n}");
        assert!(
            ask(
                &store,
                &format!("j{n}"),
                &format!("m{n}"),
                &text,
                T0 + ms(n)
            )
            .await
        );
    }
    let page = |before| {
        let store = store.clone();
        async move { store.chat_history("s1", before, 2).await.expect("history") }
    };
    let questions = |page: &[ChatExchange]| -> Vec<String> {
        page.iter().map(|e| e.question.clone()).collect()
    };
    let latest = page(None).await;
    assert_eq!(questions(&latest), ["question 3", "question 4"]);
    let earlier = page(Some(latest[0].cursor)).await;
    assert_eq!(questions(&earlier), ["question 1", "question 2"]);
    let first = page(Some(earlier[0].cursor)).await;
    assert_eq!(questions(&first), ["question 0"]);
    assert_eq!(page(Some(first[0].cursor)).await, []);
}

/// A session is bound to the first verified user whose question it keeps: anyone else (an
/// anonymous visitor too) is refused, their resend of its message ids as well, and nothing is
/// stored; anonymous questions before the binding do not bind it.
pub async fn a_session_belongs_to_its_first_verified_user(store: Arc<dyn Store>) {
    let as_user = |user: Option<&str>, job: &str, message: &str| ChatSubmission {
        user_id: user.map(str::to_owned),
        message_id: Some(message.into()),
        now: T0 + ms(1),
        ..question("s1", job)
    };
    assert_eq!(store.chat_session_owner("s1").await.expect("owner"), None);
    let anonymous = store.submit_chat(as_user(None, "j0", "m0")).await;
    assert!(matches!(anonymous.expect("kept"), Submitted::Job(_)));
    assert_eq!(store.chat_session_owner("s1").await.expect("owner"), None);
    let first = store
        .submit_chat(as_user(Some("user-42"), "j1", "m1"))
        .await;
    assert!(matches!(first.expect("kept"), Submitted::Job(_)));
    assert_eq!(
        store
            .chat_session_owner("s1")
            .await
            .expect("owner")
            .as_deref(),
        Some("user-42")
    );
    for (user, job, message) in [
        (None, "j2", "m2"),
        (Some("user-7"), "j3", "m3"),
        // Resends of the owner's message: nothing of theirs is named.
        (None, "j4", "m1"),
        (Some("user-7"), "j5", "m1"),
    ] {
        let refused = store.submit_chat(as_user(user, job, message)).await;
        assert_eq!(
            refused.expect("answered"),
            Submitted::NotYours,
            "{user:?} {message}"
        );
    }
    let again = store
        .submit_chat(as_user(Some("user-42"), "j6", "m1"))
        .await;
    let Submitted::Job(again) = again.expect("kept") else {
        panic!("the owner's resend gets its job");
    };
    assert_eq!((again.job_id.as_str(), again.created), ("j1", false));
    let history = store.chat_history("s1", None, 10).await.expect("history");
    assert_eq!(history.len(), 2, "nothing of the refused was kept");
    // Forgetting the session forgets whose it was.
    let subject =
        sabi::store::Subject::parse(sabi::domain::Channel::Webchat, "s1").expect("a session");
    store
        .forget_customer(&subject, T0 + ms(5))
        .await
        .expect("forgotten");
    assert_eq!(store.chat_session_owner("s1").await.expect("owner"), None);
}

/// A session that asks too fast is told when its oldest question of the minute leaves it.
pub async fn a_session_asking_too_fast_is_told_the_real_wait(store: Arc<dyn Store>) {
    let at = |job: &str, offset: u64| ChatSubmission {
        per_minute: 2,
        now: T0 + ms(offset),
        ..question("s1", job)
    };
    for (job, offset) in [("j1", 0), ("j2", 20_000)] {
        let kept = store.submit_chat(at(job, offset)).await.expect("kept");
        assert!(matches!(kept, Submitted::Job(_)), "{kept:?}");
    }
    let refused = store.submit_chat(at("j3", 45_000)).await.expect("answered");
    assert_eq!(
        refused,
        Submitted::TooFast {
            retry_after: ms(15_000)
        },
        "j1 leaves the minute 15 s later"
    );
    let kept = store.submit_chat(at("j3", 61_000)).await.expect("kept");
    assert!(matches!(kept, Submitted::Job(_)), "j1 has left: {kept:?}");
    let refused = store.submit_chat(at("j4", 70_000)).await.expect("answered");
    assert_eq!(
        refused,
        Submitted::TooFast {
            retry_after: ms(10_000)
        },
        "then j2 leaves, 10 s later"
    );
}
