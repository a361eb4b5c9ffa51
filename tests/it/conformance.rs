//! The store conformance suite: the same cases for every backend, at the level of the `Store`
//! interface, each on a fresh store (a new SQLite file, a new PostgreSQL database, a new Redis
//! key prefix). A backend
//! is added by its constructor and one `suite!` line; every case then runs against it.
//!
//! The cases try to break the invariants the rest of Sabi relies on: deduplication (also under
//! concurrency), order, windows and caps, one claimer wins, lapsed leases, stale tokens,
//! messages during a turn, outbox at-most-once, review, web-chat job idempotency, history.
//! The modules below hold the cases for the rest of each role's methods, so that every method
//! of every role is held to one behaviour on every backend.

mod batches;
mod broadcasts;
mod categories;
mod customers;
mod desk;
mod fixtures;
mod inspection;
mod learning;
mod people;
mod prices;
mod retention;
mod sending;
mod statuses;
mod turns;
mod webchat;

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use sabi::clock::{At, UnixSeconds};
use sabi::domain::{
    BatchPolicy, Channel, ConversationKey, InboundItem, ItemKind, ReplyPart, ReviewReason,
};
use sabi::store::{
    self, ChatSubmission, Ending, Ingest, PgStore, RedisStore, Resolution, ReviewQuery, SendClaim,
    SendResult, SqliteStore, Store, Submitted,
};
use sqlx::{AssertSqlSafe, Connection, PgConnection};

use self::batches::every_transition_of_a_batch_follows_the_rulebook;
use self::broadcasts::{
    a_broadcast_is_kept_once_per_key_with_its_audience,
    a_stopped_template_pauses_its_broadcasts_and_its_approval_resumes_them,
    broadcasts_pause_resume_and_cancel_as_the_rulebook_allows,
    claimers_at_once_never_pass_the_messaging_limit,
    claimers_at_once_never_take_one_recipient_twice,
    opt_outs_keep_the_latest_choice_and_claims_skip_them,
    quiet_hours_and_wall_clock_times_hold_each_recipient_on_its_own_clock,
    recipients_are_sent_at_most_once_and_broadcasts_end,
    statuses_move_broadcast_recipients_forward_only,
    the_cooldown_skips_and_the_messaging_limit_holds_back,
    time_starts_and_ends_broadcasts_and_halted_or_paused_ones_wait,
};
use self::categories::template_categories_keep_meta_s_latest_word;
use self::customers::{
    a_customer_meta_names_by_number_and_bsuid_is_one_customer,
    a_customers_deliveries_at_once_keep_the_order_sent, a_forgotten_chat_session_leaves_no_history,
    a_forgotten_customer_is_sent_no_broadcast,
    a_late_status_about_a_broadcast_to_a_forgotten_customer_is_known,
    a_wave_of_customers_at_once_is_kept_once_each_under_its_key,
    after_forget_late_statuses_are_known_and_only_her_own_parts_are_emptied,
    an_export_comes_a_page_at_a_time, deliveries_at_once_each_hear_their_own_receipt,
    export_holds_everything_and_forget_leaves_only_hashes,
    forget_racing_ingest_and_claims_takes_only_its_customer,
    forget_waits_for_work_under_way_for_the_customer,
    ids_are_never_given_twice_after_the_newest_customer_is_forgotten,
};
use self::desk::a_desk_holds_its_conversation_and_its_replies_go_once;
use self::inspection::{
    a_fresh_store_is_ready_and_holds_nothing, gauges_count_the_pipeline_as_it_moves,
    quarantine_keeps_each_raw_part_once_in_arrival_order,
    the_inbox_filters_by_kind_channel_position_and_limit,
};
use self::learning::routed_turns_keep_the_guess_who_answered_and_a_label;
use self::people::{
    a_persons_reply_holds_the_conversation_until_they_let_it_go,
    conversations_list_every_thread_of_a_customer, review_items_read_alike_open_or_settled,
};
use self::prices::{
    a_priced_message_is_counted_once_with_its_latest_pricing,
    statuses_of_one_message_at_once_count_it_once,
    the_ledger_reads_whole_hours_and_goes_at_the_messages_horizon,
};
use self::retention::{
    a_sweep_racing_ingest_and_a_turn_loses_and_doubles_nothing,
    a_turn_not_yet_settled_keeps_everything, an_expired_chat_question_goes_with_its_job,
    one_node_holds_the_sweepers_lease_at_a_time,
    what_is_past_its_horizon_goes_and_its_retry_stays_a_duplicate,
};
use self::sending::{
    a_lapsed_claim_goes_again_and_an_unknown_part_holds_only_its_own_reply,
    next_send_due_is_the_earliest_head_hold_retry_or_wait,
};
use self::statuses::{
    a_closed_window_sends_the_template_once, a_failure_after_sent_goes_to_a_person_once,
    a_lapsed_send_with_no_status_goes_to_a_person, a_late_failure_stays_with_the_person,
    a_status_naming_an_unknown_send_settles_it, a_status_settles_a_send_under_way_at_once,
    statuses_only_move_a_delivery_forward,
};
use self::turns::{
    a_batch_puts_messages_of_unknown_time_first,
    a_held_batch_keeps_its_place_and_its_holding_message_goes_first,
    a_running_turns_stage_shows_in_its_chat_job, a_transcript_fills_in_only_a_message_without_text,
    history_holds_the_turns_before_the_batch_with_notes,
    holders_and_claimers_at_once_take_each_customer_once,
    next_due_is_the_earliest_window_lease_or_retry, routine_turns_are_claimed_first_and_never_held,
    turn_stats_tell_local_agent_and_people_turns_apart,
};
use self::webchat::{
    a_session_asking_too_fast_is_told_the_real_wait, a_session_belongs_to_its_first_verified_user,
    a_sessions_history_is_in_the_order_asked, a_sessions_history_pages_back_by_its_cursor,
    a_visitor_talks_to_the_person_holding_their_chat,
    chat_history_and_queue_depth_follow_each_question,
};
use crate::helpers::ms;
use crate::services;
use crate::walk::every_transition_of_a_reply_part_follows_the_rulebook;

/// A fresh SQLite store in its own directory (kept alive by the returned guard).
async fn sqlite() -> Option<(Arc<dyn Store>, tempfile::TempDir)> {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(&dir.path().join("sabi.db"), crate::helpers::marks())
        .await
        .expect("store");
    Some((Arc::new(store), dir))
}

/// A fresh PostgreSQL database, dropped when the guard goes; `None` (the test skipped) where
/// no PostgreSQL can be had (see `services`).
pub async fn postgres() -> Option<(Arc<dyn Store>, PgDatabase)> {
    let db = PgDatabase::create().await?;
    let store = PgStore::open(&db.url, crate::helpers::marks())
        .await
        .expect("postgres store");
    Some((Arc::new(store), db))
}

/// A throwaway database on the test server.
pub struct PgDatabase {
    pub url: String,
    server: String,
    name: String,
}

impl PgDatabase {
    pub async fn create() -> Option<PgDatabase> {
        let server = services::postgres()?.to_owned();
        let mut id = [0u8; 6];
        getrandom::fill(&mut id).expect("random");
        let name = format!("sabi_test_{}", hex::encode(id));
        let mut admin = PgConnection::connect(&format!("{server}/postgres"))
            .await
            .expect("the test PostgreSQL server is reachable");
        sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await
            .expect("create database");
        Some(PgDatabase {
            url: format!("{server}/{name}"),
            server,
            name,
        })
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        let (server, name) = (self.server.clone(), self.name.clone());
        // Drop runs outside any runtime's reach: a thread of its own does the async cleanup.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                if let Ok(mut admin) = PgConnection::connect(&format!("{server}/postgres")).await {
                    let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                    let _ = sqlx::query(AssertSqlSafe(sql)).execute(&mut admin).await;
                }
            });
        })
        .join();
    }
}

/// A fresh key prefix on the test Redis, its keys deleted when the guard goes; `None` (the
/// test skipped) where no Redis can be had.
pub async fn redis() -> Option<(Arc<dyn Store>, RedisPrefix)> {
    let prefix = RedisPrefix::new()?;
    let store = RedisStore::open(&prefix.url, crate::helpers::marks())
        .await
        .expect("redis store");
    Some((Arc::new(store), prefix))
}

/// A throwaway key prefix on the test server.
pub struct RedisPrefix {
    pub url: String,
    server: String,
    pattern: String,
}

impl RedisPrefix {
    pub fn new() -> Option<RedisPrefix> {
        let server = services::redis()?.to_owned();
        let mut id = [0u8; 6];
        getrandom::fill(&mut id).expect("random");
        let name = format!("sabi_test_{}", hex::encode(id));
        Some(RedisPrefix {
            url: format!("{server}?prefix={name}"),
            server,
            pattern: format!("{{{name}}}:*"),
        })
    }

    /// The hash tag its keys start with.
    pub fn tag(&self) -> String {
        self.pattern.trim_end_matches(":*").to_owned()
    }
}

impl Drop for RedisPrefix {
    fn drop(&mut self) {
        let (server, pattern) = (self.server.clone(), self.pattern.clone());
        let _ = std::thread::spawn(move || {
            let Ok(client) = ::redis::Client::open(server) else {
                return;
            };
            let Ok(mut conn) = client.get_connection() else {
                return;
            };
            let keys: Vec<String> = ::redis::cmd("KEYS")
                .arg(&pattern)
                .query(&mut conn)
                .unwrap_or_default();
            for chunk in keys.chunks(500) {
                let _: ::redis::RedisResult<()> = ::redis::cmd("DEL").arg(chunk).query(&mut conn);
            }
        })
        .join();
    }
}

/// Every case, named once: `cases!(then!(args))` calls `then!(args case, case, ...)`.
macro_rules! cases {
    ($then:ident!($($args:tt)*)) => {
        $then!($($args)*
            duplicates_change_nothing_even_at_once,
            a_batch_is_in_the_order_sent,
            the_inbox_keeps_a_deliverys_order_across_conversations,
            every_transition_of_a_reply_part_follows_the_rulebook,
            every_transition_of_a_batch_follows_the_rulebook,
            due_is_the_window_after_the_last_but_never_past_the_cap,
            one_claimer_wins,
            a_lapsed_lease_is_taken_over_with_a_new_token,
            stale_tokens_are_refused,
            messages_during_a_turn_wait_for_the_next,
            reply_parts_are_written_and_sent_at_most_once,
            review_items_are_settled_once,
            a_requeued_send_that_fails_again_is_back_in_review,
            chat_jobs_are_idempotent_under_races,
            a_session_burst_cannot_pass_its_limit,
            crossing_deliveries_all_land,
            history_is_read_from_the_store_in_turn_order,
            deletions_and_edits_change_only_a_waiting_message,
            a_claim_of_one_channel_takes_only_its_conversations,
            a_queue_burst_cannot_pass_its_cap,
            whatsapp_hand_offs_come_first_in_review,
            // Intake: status webhooks
            statuses_only_move_a_delivery_forward,
            a_failure_after_sent_goes_to_a_person_once,
            a_closed_window_sends_the_template_once,
            a_status_naming_an_unknown_send_settles_it,
            a_status_settles_a_send_under_way_at_once,
            a_late_failure_stays_with_the_person,
            a_lapsed_send_with_no_status_goes_to_a_person,
            a_priced_message_is_counted_once_with_its_latest_pricing,
            statuses_of_one_message_at_once_count_it_once,
            the_ledger_reads_whole_hours_and_goes_at_the_messages_horizon,
            // Turns
            next_due_is_the_earliest_window_lease_or_retry,
            a_held_batch_keeps_its_place_and_its_holding_message_goes_first,
            routine_turns_are_claimed_first_and_never_held,
            holders_and_claimers_at_once_take_each_customer_once,
            turn_stats_tell_local_agent_and_people_turns_apart,
            a_running_turns_stage_shows_in_its_chat_job,
            a_transcript_fills_in_only_a_message_without_text,
            history_holds_the_turns_before_the_batch_with_notes,
            a_batch_puts_messages_of_unknown_time_first,
            // Sending
            next_send_due_is_the_earliest_head_hold_retry_or_wait,
            a_lapsed_claim_goes_again_and_an_unknown_part_holds_only_its_own_reply,
            // Reviews
            review_items_read_alike_open_or_settled,
            conversations_list_every_thread_of_a_customer,
            a_persons_reply_holds_the_conversation_until_they_let_it_go,
            a_customer_meta_names_by_number_and_bsuid_is_one_customer,
            a_desk_holds_its_conversation_and_its_replies_go_once,
            // WebChat
            chat_history_and_queue_depth_follow_each_question,
            a_sessions_history_is_in_the_order_asked,
            a_sessions_history_pages_back_by_its_cursor,
            a_session_belongs_to_its_first_verified_user,
            a_session_asking_too_fast_is_told_the_real_wait,
            a_visitor_talks_to_the_person_holding_their_chat,
            // Inspection and Health
            gauges_count_the_pipeline_as_it_moves,
            the_inbox_filters_by_kind_channel_position_and_limit,
            quarantine_keeps_each_raw_part_once_in_arrival_order,
            a_fresh_store_is_ready_and_holds_nothing,
            // Learning from use (Turns, Reviews, Inspection)
            routed_turns_keep_the_guess_who_answered_and_a_label,
            // Broadcasts
            a_broadcast_is_kept_once_per_key_with_its_audience,
            broadcasts_pause_resume_and_cancel_as_the_rulebook_allows,
            recipients_are_sent_at_most_once_and_broadcasts_end,
            claimers_at_once_never_take_one_recipient_twice,
            statuses_move_broadcast_recipients_forward_only,
            time_starts_and_ends_broadcasts_and_halted_or_paused_ones_wait,
            opt_outs_keep_the_latest_choice_and_claims_skip_them,
            a_stopped_template_pauses_its_broadcasts_and_its_approval_resumes_them,
            the_cooldown_skips_and_the_messaging_limit_holds_back,
            quiet_hours_and_wall_clock_times_hold_each_recipient_on_its_own_clock,
            claimers_at_once_never_pass_the_messaging_limit,
            template_categories_keep_meta_s_latest_word,
            // Customers
            export_holds_everything_and_forget_leaves_only_hashes,
            an_export_comes_a_page_at_a_time,
            forget_waits_for_work_under_way_for_the_customer,
            ids_are_never_given_twice_after_the_newest_customer_is_forgotten,
            a_forgotten_customer_is_sent_no_broadcast,
            a_forgotten_chat_session_leaves_no_history,
            forget_racing_ingest_and_claims_takes_only_its_customer,
            a_wave_of_customers_at_once_is_kept_once_each_under_its_key,
            deliveries_at_once_each_hear_their_own_receipt,
            a_customers_deliveries_at_once_keep_the_order_sent,
            after_forget_late_statuses_are_known_and_only_her_own_parts_are_emptied,
            a_late_status_about_a_broadcast_to_a_forgotten_customer_is_known,
            // Retention
            what_is_past_its_horizon_goes_and_its_retry_stays_a_duplicate,
            a_turn_not_yet_settled_keeps_everything,
            a_sweep_racing_ingest_and_a_turn_loses_and_doubles_nothing,
            an_expired_chat_question_goes_with_its_job,
            one_node_holds_the_sweepers_lease_at_a_time,
        );
    };
}

/// Every case, against one backend: a test each, on a fresh store each.
macro_rules! suite {
    ($backend:ident) => {
        mod $backend {
            cases!(suite!(@cases $backend:));
        }
    };
    (@cases $backend:ident: $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let Some((store, _guard)) = super::$backend().await else {
                    return; // skipped: see `services`
                };
                super::$case(store).await;
            }
        )*
    };
}

/// Every case on a Redis Cluster of three nodes started for the purpose: one test, each case
/// on a key prefix of its own (so on a slot of its own, wherever the cluster put it).
macro_rules! on_cluster {
    ($($case:ident),* $(,)?) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn every_case_passes_on_a_redis_cluster() {
            if !(services::program("redis-server", "redis-server")
                && services::program("redis-cli", "redis-tools"))
            {
                return;
            }
            let cluster = RedisCluster::start();
            // Its nodes keep no append-only file: the slot's primary says so.
            let strict = format!("{}&durability=require", cluster.url("strict"));
            assert!(RedisStore::open(&strict, crate::helpers::marks()).await.is_err());
            $(
                let store = RedisStore::open(&cluster.url(stringify!($case)), crate::helpers::marks())
                    .await
                    .expect("cluster store");
                $case(Arc::new(store)).await;
            )*
        }
    };
}

cases!(on_cluster!());

/// Three `redis-server` nodes in cluster mode on free ports, the slots shared out by
/// `redis-cli --cluster create`; stopped when dropped.
struct RedisCluster {
    ports: Vec<u16>,
    nodes: Vec<std::process::Child>,
    _dir: tempfile::TempDir,
}

impl RedisCluster {
    fn start() -> RedisCluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let ports: Vec<u16> = (0..3).map(|_| services::free_port()).collect();
        let nodes = ports
            .iter()
            .map(|port| {
                let node_dir = dir.path().join(port.to_string());
                std::fs::create_dir(&node_dir).expect("node dir");
                std::process::Command::new("redis-server")
                    .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                    .args([
                        "--cluster-enabled",
                        "yes",
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                    ])
                    .current_dir(&node_dir)
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .expect("redis-server runs")
            })
            .collect();
        let cluster = RedisCluster {
            ports,
            nodes,
            _dir: dir,
        };
        for port in &cluster.ports {
            wait_for(|| std::net::TcpStream::connect(("127.0.0.1", *port)).is_ok());
        }
        let made = std::process::Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(cluster.ports.iter().map(|p| format!("127.0.0.1:{p}")))
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli runs");
        assert!(made.status.success(), "cluster create: {made:?}");
        for port in &cluster.ports {
            wait_for(|| {
                std::process::Command::new("redis-cli")
                    .args(["-p", &port.to_string(), "cluster", "info"])
                    .output()
                    .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("cluster_state:ok"))
            });
        }
        cluster
    }

    /// The store on the cluster, under `prefix`, reached through its first node.
    fn url(&self, prefix: &str) -> String {
        format!(
            "redis://127.0.0.1:{}?cluster=true&prefix={prefix}",
            self.ports[0]
        )
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            let _ = node.kill();
            let _ = node.wait();
        }
    }
}

fn wait_for(done: impl Fn() -> bool) {
    let start = std::time::Instant::now();
    while !done() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(20),
            "the cluster did not come up"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

suite!(sqlite);
suite!(postgres);
suite!(redis);

/// The recipient spacing a delivery's statuses hold when they settle a send under way.
pub const PAIR_SPACING: std::time::Duration = std::time::Duration::from_secs(1);
/// How long a person's reply holds the conversation in these tests (`engine.human_hold`).
pub const HUMAN_HOLD: std::time::Duration = std::time::Duration::from_secs(3600);
pub const T0: At = At::from_millis(1_781_000_000_000);
pub const POLICY: BatchPolicy = BatchPolicy {
    window: Duration::from_millis(10_000),
    cap: Duration::from_millis(12_000),
};

fn key(customer: &str) -> ConversationKey {
    ConversationKey {
        channel: Channel::Whatsapp,
        business: "100000000000001".into(),
        customer: customer.into(),
    }
}

pub fn message(id: &str, customer: &str, text: &str, sent: At) -> InboundItem {
    InboundItem {
        kind: ItemKind::Message,
        channel: Channel::Whatsapp,
        dedupe_key: id.into(),
        business: Some("100000000000001".into()),
        customer: Some(customer.into()),
        item_type: Some("text".into()),
        text: Some(text.into()),
        media_id: None,
        provider_ts: Some(UnixSeconds(sent.unix_seconds())),
        turn: Some(key(customer)),
        facts: serde_json::json!({"id": id}),
    }
}

pub(crate) async fn ingest(
    store: &Arc<dyn Store>,
    items: Vec<InboundItem>,
    at: At,
) -> store::IngestReceipt {
    let delivery = Ingest {
        routine: Default::default(),
        items,
        quarantined: Vec::new(),
        received_at: at,
        policy: POLICY,
        pair_spacing: PAIR_SPACING,
        human_hold: HUMAN_HOLD,
    };
    store.ingest(delivery).await.expect("ingest")
}

fn reply(text: &str) -> Ending {
    Ending::Replied {
        parts: vec![ReplyPart::text(text)],
        sandbox: false,
    }
}

/// The customer's change to an earlier message (WhatsApp `revoke` or `edit`), as the parser
/// gives it: a message of its own that names the original and wakes nothing.
fn amendment(id: &str, customer: &str, original: &str, edited: Option<&str>) -> InboundItem {
    InboundItem {
        item_type: Some(if edited.is_some() { "edit" } else { "revoke" }.into()),
        text: edited.map(str::to_owned),
        turn: None,
        facts: serde_json::json!({"id": id, "amends": original}),
        ..message(id, customer, "", T0 + ms(5_000))
    }
}

async fn deletions_and_edits_change_only_a_waiting_message(store: Arc<dyn Store>) {
    let sent = T0;
    let first = message("wamid.a1", "c1", "first", sent);
    let second = message("wamid.a2", "c1", "second", sent + ms(1));
    ingest(&store, vec![first, second], T0).await;
    // Deleted and edited while they wait: one leaves the batch, the other is read as edited.
    let deleted = amendment("wamid.a3", "c1", "wamid.a1", None);
    let edited = amendment("wamid.a4", "c1", "wamid.a2", Some("second, edited"));
    let receipt = ingest(&store, vec![deleted, edited], T0 + ms(1_000)).await;
    assert_eq!((receipt.stored, receipt.earliest_due), (2, None));
    // A conversation whose only message was deleted is no longer due.
    ingest(&store, vec![message("wamid.b1", "c2", "oops", sent)], T0).await;
    let gone = amendment("wamid.b2", "c2", "wamid.b1", None);
    ingest(&store, vec![gone], T0 + ms(1_000)).await;

    let claims = store
        .claim(T0 + ms(60_000), ms(1_000), 10, None)
        .await
        .expect("claim");
    assert_eq!(claims.len(), 1, "nothing is due for c2");
    let batch = &claims[0].batch;
    assert_eq!(batch.conversation.customer, "c1");
    let texts: Vec<_> = batch
        .messages
        .iter()
        .filter_map(|m| m.text.clone())
        .collect();
    assert_eq!(texts, ["second, edited"]);

    // Once in a turn, a change is kept as a fact and changes nothing.
    let late_edit = amendment("wamid.a5", "c1", "wamid.a2", Some("too late"));
    let late_delete = amendment("wamid.a6", "c1", "wamid.a2", None);
    let receipt = ingest(&store, vec![late_edit, late_delete], T0 + ms(61_000)).await;
    assert_eq!((receipt.stored, receipt.earliest_due), (2, None));
    let inbox = store.inbox(Default::default()).await.expect("inbox");
    let state = |key: &str| {
        let stored = inbox.iter().find(|i| i.item.dedupe_key == key).expect(key);
        (stored.state.as_str(), stored.item.text.clone())
    };
    assert_eq!(state("wamid.a1").0, "withdrawn");
    assert_eq!(state("wamid.b1").0, "withdrawn");
    assert_eq!(
        state("wamid.a2"),
        ("batched", Some("second, edited".to_owned()))
    );
    assert_eq!(state("wamid.a5").0, "skipped");
}

async fn duplicates_change_nothing_even_at_once(store: Arc<dyn Store>) {
    let item = message("wamid.d1", "c1", "hello", T0);
    let receipts = join_all((0..20).map(|_| ingest(&store, vec![item.clone()], T0))).await;
    assert_eq!(receipts.iter().map(|r| r.stored).sum::<usize>(), 1);
    assert_eq!(receipts.iter().map(|r| r.duplicates).sum::<usize>(), 19);
    let other = message("wamid.d1", "c1", "other words", T0);
    assert_eq!(ingest(&store, vec![other], T0).await.anomalies, 1);
    let inbox = store.inbox(Default::default()).await.expect("inbox");
    assert_eq!(inbox.len(), 1);
    assert_eq!(inbox[0].item.text.as_deref(), Some("hello"));
}

async fn the_inbox_keeps_a_deliverys_order_across_conversations(store: Arc<dyn Store>) {
    // Backends may store a delivery's items in another order (PostgreSQL takes its row locks
    // by conversation); arrival order is still the delivery's.
    let ids = ["wamid.x1", "wamid.x2", "wamid.x3", "wamid.x4"];
    let items = ids
        .iter()
        .zip(["c3", "c1", "c2", "c1"])
        .map(|(id, customer)| message(id, customer, "hi", T0))
        .collect();
    ingest(&store, items, T0).await;
    let inbox = store.inbox(Default::default()).await.expect("inbox");
    let order: Vec<_> = inbox.iter().map(|i| i.item.dedupe_key.as_str()).collect();
    assert_eq!(order, ids);
}

async fn a_batch_is_in_the_order_sent(store: Arc<dyn Store>) {
    // Delivered in reverse, one webhook each.
    for (i, sent) in [(3, 30), (2, 20), (1, 10)] {
        let item = message(
            &format!("wamid.o{i}"),
            "c1",
            &format!("m{i}"),
            T0 + Duration::from_secs(sent),
        );
        ingest(&store, vec![item], T0).await;
    }
    let claims = store
        .claim(T0 + ms(60_000), ms(1_000), 10, None)
        .await
        .expect("claim");
    let texts: Vec<_> = claims[0]
        .batch
        .messages
        .iter()
        .filter_map(|m| m.text.clone())
        .collect();
    assert_eq!(texts, ["m1", "m2", "m3"]);
}

async fn due_is_the_window_after_the_last_but_never_past_the_cap(store: Arc<dyn Store>) {
    let first = ingest(&store, vec![message("wamid.w1", "c1", "a", T0)], T0).await;
    assert_eq!(first.earliest_due, Some(T0 + ms(10_000)));
    let second = ingest(
        &store,
        vec![message("wamid.w2", "c1", "b", T0 + ms(5_000))],
        T0 + ms(5_000),
    )
    .await;
    // min(last + window, first + cap) = min(15 s, 12 s)
    assert_eq!(second.earliest_due, Some(T0 + ms(12_000)));
    assert!(
        store
            .claim(T0 + ms(11_999), ms(1_000), 10, None)
            .await
            .expect("claim")
            .is_empty()
    );
    let claims = store
        .claim(T0 + ms(12_000), ms(1_000), 10, None)
        .await
        .expect("claim");
    assert_eq!(claims.len(), 1);
    assert_eq!(claims[0].batch.messages.len(), 2);
}

async fn one_claimer_wins(store: Arc<dyn Store>) {
    ingest(&store, vec![message("wamid.c1", "c1", "a", T0)], T0).await;
    let at = T0 + ms(20_000);
    let claims = join_all((0..10).map(|_| store.claim(at, ms(1_000), 5, None))).await;
    let won: usize = claims.into_iter().map(|c| c.expect("claim").len()).sum();
    assert_eq!(won, 1);
}

async fn a_lapsed_lease_is_taken_over_with_a_new_token(store: Arc<dyn Store>) {
    ingest(&store, vec![message("wamid.l1", "c1", "a", T0)], T0).await;
    let at = T0 + ms(20_000);
    let first = store
        .claim(at, ms(1_000), 5, None)
        .await
        .expect("claim")
        .remove(0);
    assert!(
        store
            .claim(at + ms(999), ms(1_000), 5, None)
            .await
            .expect("claim")
            .is_empty()
    );
    let again = store
        .claim(at + ms(1_000), ms(1_000), 5, None)
        .await
        .expect("claim");
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].batch.id, first.batch.id);
    assert_eq!(again[0].attempt, 2);
    assert_ne!(again[0].token, first.token);
    // Renewing keeps it.
    store
        .renew(first.batch.id, again[0].token, at + ms(1_500), ms(1_000))
        .await
        .expect("renew");
    assert!(
        store
            .claim(at + ms(2_200), ms(1_000), 5, None)
            .await
            .expect("claim")
            .is_empty()
    );
}

async fn stale_tokens_are_refused(store: Arc<dyn Store>) {
    ingest(&store, vec![message("wamid.s1", "c1", "a", T0)], T0).await;
    let at = T0 + ms(20_000);
    let stale = store
        .claim(at, ms(1_000), 5, None)
        .await
        .expect("claim")
        .remove(0);
    let fresh = store
        .claim(at + ms(1_000), ms(1_000), 5, None)
        .await
        .expect("claim")
        .remove(0);
    let refused = store
        .finish(stale.batch.id, stale.token, at + ms(1_100), reply("late"))
        .await;
    assert!(matches!(refused, Err(store::Error::LeaseLost)));
    let refused = store
        .renew(stale.batch.id, stale.token, at + ms(1_100), ms(1_000))
        .await;
    assert!(matches!(refused, Err(store::Error::LeaseLost)));
    assert!(
        store.outbox(None).await.expect("outbox").is_empty(),
        "nothing written"
    );
    store
        .finish(
            fresh.batch.id,
            fresh.token,
            at + ms(1_200),
            reply("on time"),
        )
        .await
        .expect("finish");
    let again = store
        .finish(fresh.batch.id, fresh.token, at + ms(1_300), reply("twice"))
        .await;
    assert!(
        matches!(again, Err(store::Error::LeaseLost)),
        "a batch ends once"
    );
    let outbox = store.outbox(None).await.expect("outbox");
    assert_eq!(outbox.len(), 1);
    assert_eq!(outbox[0].text, "on time");
}

async fn messages_during_a_turn_wait_for_the_next(store: Arc<dyn Store>) {
    ingest(&store, vec![message("wamid.t1", "c1", "first", T0)], T0).await;
    let at = T0 + ms(20_000);
    let running = store
        .claim(at, ms(60_000), 5, None)
        .await
        .expect("claim")
        .remove(0);
    ingest(&store, vec![message("wamid.t2", "c1", "second", at)], at).await;
    assert!(
        store
            .claim(at + ms(30_000), ms(60_000), 5, None)
            .await
            .expect("claim")
            .is_empty(),
        "no second turn while one runs"
    );
    store
        .finish(
            running.batch.id,
            running.token,
            at + ms(31_000),
            reply("ok"),
        )
        .await
        .expect("finish");
    let next = store
        .claim(at + ms(31_000), ms(60_000), 5, None)
        .await
        .expect("claim");
    assert_eq!(next.len(), 1);
    let texts: Vec<_> = next[0]
        .batch
        .messages
        .iter()
        .filter_map(|m| m.text.clone())
        .collect();
    assert_eq!(texts, ["second"]);
}

async fn reply_parts_are_written_and_sent_at_most_once(store: Arc<dyn Store>) {
    for c in ["c1", "c2", "c3"] {
        ingest(
            &store,
            vec![message(&format!("wamid.p-{c}"), c, "hi", T0)],
            T0,
        )
        .await;
    }
    let at = T0 + ms(20_000);
    for claim in store.claim(at, ms(60_000), 5, None).await.expect("claim") {
        let parts = vec![ReplyPart::text("one"), ReplyPart::text("two")];
        let ending = Ending::Replied {
            parts,
            sandbox: false,
        };
        store
            .finish(claim.batch.id, claim.token, at, ending)
            .await
            .expect("finish");
    }
    let claim = |now| SendClaim {
        now,
        lease: ms(10_000),
        unknown_wait: ms(60_000),
        limit: 10,
        halted: Vec::new(),
    };
    // Many senders at once: each head part goes to exactly one of them.
    let claimed: Vec<_> = join_all((0..8).map(|_| store.claim_sends(claim(at))))
        .await
        .into_iter()
        .flat_map(|jobs| jobs.expect("claim sends").jobs)
        .collect();
    assert_eq!(claimed.len(), 3, "one head part per customer, once");
    assert!(claimed.iter().all(|j| j.part == 0));
    for job in &claimed {
        let accepted = SendResult::Accepted {
            wamid: format!("wamid.out-{}", job.id),
            template: false,
            next_send_at: at,
        };
        store
            .depart(job.id, job.attempt, at, ms(10_000))
            .await
            .expect("departed");
        let again = store.depart(job.id, job.attempt, at, ms(10_000)).await;
        assert!(matches!(again, Err(store::Error::LeaseLost)), "once");
        store
            .record_send(job.id, job.attempt, at, accepted.clone())
            .await
            .expect("recorded");
        // The same answer again (a commit whose reply was lost) changes nothing; another
        // answer for the send is refused: Meta has the part.
        store
            .record_send(job.id, job.attempt, at, accepted)
            .await
            .expect("the same answer again");
        let lost = SendResult::Unknown {
            error: "timed out".into(),
            wait_until: at,
        };
        let other = store.record_send(job.id, job.attempt, at, lost).await;
        assert!(matches!(other, Err(store::Error::LeaseLost)));
    }
    let next = store
        .claim_sends(claim(at))
        .await
        .expect("claim sends")
        .jobs;
    assert_eq!(next.len(), 3);
    assert!(next.iter().all(|j| j.part == 1), "in order per customer");
}

/// Ends a claimed batch in review, as too old for an automatic reply.
async fn too_old(store: &Arc<dyn Store>, claim: &sabi::domain::Claim, at: At) {
    let review = Ending::Review {
        reason: ReviewReason::TooOld,
        error: None,
    };
    store
        .finish(claim.batch.id, claim.token, at, review)
        .await
        .expect("finish");
}

async fn whatsapp_hand_offs_come_first_in_review(store: Arc<dyn Store>) {
    // Anonymous web visitors hand off first, then a WhatsApp customer.
    for n in 0..3 {
        store
            .submit_chat(ChatSubmission {
                question: "I want a human".into(),
                ..question(format!("anon-{n}"), format!("handoff-{n}"))
            })
            .await
            .expect("submitted");
    }
    let at = T0 + ms(1_000);
    for claim in store.claim(at, ms(60_000), 10, None).await.expect("claim") {
        too_old(&store, &claim, at).await;
    }
    ingest(&store, vec![message("wamid.h1", "c1", "help", T0)], at).await;
    let later = at + ms(20_000);
    for claim in store
        .claim(later, ms(60_000), 5, None)
        .await
        .expect("claim")
    {
        too_old(&store, &claim, later).await;
    }
    let queue = store
        .review_queue(ReviewQuery {
            limit: Some(2),
            ..ReviewQuery::default()
        })
        .await
        .expect("queue");
    assert_eq!(queue.len(), 2);
    assert_eq!(
        queue[0].conversation.channel,
        Channel::Whatsapp,
        "{queue:?}"
    );
    assert_eq!(queue[1].conversation.channel, Channel::Webchat);
    // The anonymous visitor's address stays with the hand-off, for the desk to fold repeats.
    assert_eq!(queue[0].messages[0].address, None);
    assert_eq!(queue[1].messages[0].address.as_deref(), Some("203.0.113.7"));
}

async fn review_items_are_settled_once(store: Arc<dyn Store>) {
    ingest(&store, vec![message("wamid.r1", "c1", "help", T0)], T0).await;
    let at = T0 + ms(20_000);
    let claim = store
        .claim(at, ms(60_000), 5, None)
        .await
        .expect("claim")
        .remove(0);
    too_old(&store, &claim, at).await;
    let queue = store
        .review_queue(ReviewQuery::default())
        .await
        .expect("queue");
    assert_eq!(queue.len(), 1);
    assert_eq!(queue[0].reason.as_str(), "too_old");
    let id = queue[0].id;
    let answer = Resolution::Reply {
        text: "A person here.".into(),
        sandbox: false,
        hold: HUMAN_HOLD,
        desk: None,
    };
    let settled = join_all((0..5).map(|_| store.resolve_review(id, at, answer.clone()))).await;
    assert_eq!(
        settled.iter().filter(|r| r.is_ok()).count(),
        1,
        "settled once"
    );
    assert!(
        settled
            .iter()
            .filter_map(|r| r.as_ref().err())
            .all(|e| matches!(e, store::Error::NotFound))
    );
    let outbox = store.outbox(None).await.expect("outbox");
    assert_eq!(outbox.len(), 1);
    assert_eq!(outbox[0].state, "queued");
    assert!(
        store
            .review_queue(ReviewQuery::default())
            .await
            .expect("queue")
            .is_empty()
    );
}

/// A web-chat question of `session` as the HTTP layer submits it, with the defaults the cases
/// share (no window, room in the queue and the session's minute).
fn question(session: impl Into<String>, job: impl Into<String>) -> ChatSubmission {
    ChatSubmission {
        session_id: session.into(),
        message_id: None,
        user_id: None,
        address: Some("203.0.113.7".into()),
        question: "hello".into(),
        business: "web".into(),
        job_id: job.into(),
        now: T0,
        policy: BatchPolicy {
            window: Duration::ZERO,
            cap: ms(60_000),
        },
        keep: ms(3_600_000),
        per_minute: 20,
        max_queue: 1_000,
    }
}

async fn a_claim_of_one_channel_takes_only_its_conversations(store: Arc<dyn Store>) {
    // A web-chat queue due first, and a WhatsApp message due behind it.
    for n in 0..5 {
        store
            .submit_chat(question(format!("web-{n}"), format!("job-{n}")))
            .await
            .expect("submitted");
    }
    ingest(&store, vec![message("wamid.f1", "c1", "hi", T0)], T0).await;
    let at = T0 + ms(60_000);
    let whatsapp = store
        .claim(at, ms(1_000), 5, Some(Channel::Whatsapp))
        .await
        .expect("claim");
    assert_eq!(whatsapp.len(), 1);
    assert_eq!(whatsapp[0].batch.conversation.customer, "c1");
    let web = store
        .claim(at, ms(1_000), 2, Some(Channel::Webchat))
        .await
        .expect("claim");
    assert_eq!(web.len(), 2);
    assert!(
        web.iter()
            .all(|c| c.batch.conversation.channel == Channel::Webchat)
    );
    // Lapsed leases are taken back by their own channel's claims too.
    let later = at + ms(5_000);
    let whatsapp = store
        .claim(later, ms(1_000), 5, Some(Channel::Whatsapp))
        .await
        .expect("claim");
    assert_eq!(whatsapp.len(), 1);
    assert_eq!(whatsapp[0].attempt, 2);
    let rest = store
        .claim(later, ms(1_000), 10, None)
        .await
        .expect("claim");
    assert_eq!(
        rest.len(),
        5,
        "the two lapsed web batches and three new ones"
    );
}

async fn chat_jobs_are_idempotent_under_races(store: Arc<dyn Store>) {
    let submit = |n: usize| {
        let store = store.clone();
        async move {
            let submitted = store
                .submit_chat(ChatSubmission {
                    message_id: Some("m-1".into()),
                    question: "where is my order?".into(),
                    ..question("s-1", format!("job-{n}"))
                })
                .await
                .expect("submitted");
            let Submitted::Job(receipt) = submitted else {
                panic!("within the session's limit: {submitted:?}");
            };
            receipt
        }
    };
    let receipts = join_all((0..10).map(submit)).await;
    assert_eq!(receipts.iter().filter(|r| r.created).count(), 1);
    let job = &receipts[0].job_id;
    assert!(receipts.iter().all(|r| &r.job_id == job), "one job");
    let found = store
        .chat_job_for_message("s-1", "m-1")
        .await
        .expect("lookup");
    assert_eq!(found.as_ref(), Some(job));
    assert!(
        store
            .chat_job(job, T0 + ms(3_600_000))
            .await
            .expect("job")
            .is_none(),
        "expired"
    );
    assert_eq!(store.chat_queue_depth().await.expect("depth"), 1);
}

async fn history_is_read_from_the_store_in_turn_order(store: Arc<dyn Store>) {
    let mut at = T0;
    let mut last = 0;
    for (i, (said, answered)) in [("hello", "Hi!"), ("my order?", "Ships tomorrow.")]
        .into_iter()
        .enumerate()
    {
        ingest(
            &store,
            vec![message(&format!("wamid.h{i}"), "c1", said, at)],
            at,
        )
        .await;
        at = at + ms(20_000);
        let claim = store
            .claim(at, ms(60_000), 5, None)
            .await
            .expect("claim")
            .remove(0);
        last = claim.batch.id;
        store
            .finish(claim.batch.id, claim.token, at, reply(answered))
            .await
            .expect("finish");
    }
    ingest(&store, vec![message("wamid.h9", "c1", "thanks", at)], at).await;
    let third = store
        .claim(at + ms(20_000), ms(60_000), 5, None)
        .await
        .expect("claim")
        .remove(0);
    assert!(third.batch.id > last);
    let history = store.history(third.batch.id, 10).await.expect("history");
    let said: Vec<_> = history.iter().map(|h| h.text.as_str()).collect();
    assert_eq!(said, ["hello", "Hi!", "my order?", "Ships tomorrow."]);
}

async fn a_requeued_send_that_fails_again_is_back_in_review(store: Arc<dyn Store>) {
    ingest(&store, vec![message("wamid.q1", "c1", "hi", T0)], T0).await;
    let at = T0 + ms(20_000);
    let claim = store
        .claim(at, ms(60_000), 5, None)
        .await
        .expect("claim")
        .remove(0);
    store
        .finish(claim.batch.id, claim.token, at, reply("hello"))
        .await
        .expect("finish");
    let sends = SendClaim {
        now: at,
        lease: ms(10_000),
        unknown_wait: ms(60_000),
        limit: 10,
        halted: Vec::new(),
    };
    let refused = |code| SendResult::Review {
        reason: ReviewReason::SendFailed,
        code: Some(code),
        error: "refused".into(),
    };
    for round in 0..2 {
        let job = store
            .claim_sends(sends.clone())
            .await
            .expect("claim")
            .jobs
            .remove(0);
        store
            .depart(job.id, job.attempt, at, ms(10_000))
            .await
            .expect("departed");
        store
            .record_send(job.id, job.attempt, at, refused(131_026))
            .await
            .expect("recorded");
        let queue = store
            .review_queue(ReviewQuery::default())
            .await
            .expect("queue");
        assert_eq!(
            queue.len(),
            1,
            "round {round}: the failed send waits for a person"
        );
        if round == 0 {
            store
                .resolve_review(queue[0].id, at, Resolution::Requeue)
                .await
                .expect("requeued");
        }
    }
}

async fn crossing_deliveries_all_land(store: Arc<dyn Store>) {
    // Deliveries touching the same two conversations in opposite orders, all at once: a backend
    // that locks rows must not lose any of them to a deadlock.
    let deliveries = (0..40).map(|n| {
        let store = store.clone();
        async move {
            let (a, b) = if n % 2 == 0 {
                ("cx", "cy")
            } else {
                ("cy", "cx")
            };
            let items = vec![
                message(&format!("wamid.x{n}a"), a, "one", T0),
                message(&format!("wamid.x{n}b"), b, "two", T0),
            ];
            let delivery = Ingest {
                routine: Default::default(),
                items,
                quarantined: Vec::new(),
                received_at: T0,
                policy: POLICY,
                pair_spacing: std::time::Duration::ZERO,
                human_hold: std::time::Duration::ZERO,
            };
            store.ingest(delivery).await
        }
    });
    let receipts = join_all(deliveries).await;
    let stored: usize = receipts
        .into_iter()
        .map(|r| r.expect("every delivery is kept").stored)
        .sum();
    assert_eq!(stored, 80);
}

async fn a_queue_burst_cannot_pass_its_cap(store: Arc<dyn Store>) {
    let submit = |n: usize| {
        let store = store.clone();
        async move {
            store
                .submit_chat(ChatSubmission {
                    question: format!("question {n}"),
                    max_queue: 5,
                    ..question(format!("s-queue-{n}"), format!("queue-{n}"))
                })
                .await
                .expect("submit")
        }
    };
    // A new session per question, all at once: the cap still holds exactly.
    let outcomes = join_all((0..20).map(submit)).await;
    let accepted = outcomes
        .iter()
        .filter(|o| matches!(o, Submitted::Job(_)))
        .count();
    assert_eq!(accepted, 5, "exactly the cap");
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Submitted::Job(_) | Submitted::QueueFull))
    );
    assert_eq!(store.chat_queue_depth().await.expect("depth"), 5);
}

async fn a_session_burst_cannot_pass_its_limit(store: Arc<dyn Store>) {
    let submit = |n: usize| {
        let store = store.clone();
        async move {
            store
                .submit_chat(ChatSubmission {
                    message_id: Some(format!("m-{n}")),
                    question: format!("question {n}"),
                    per_minute: 3,
                    ..question("s-burst", format!("burst-{n}"))
                })
                .await
                .expect("submit")
        }
    };
    let outcomes = join_all((0..10).map(submit)).await;
    let accepted = |o: &&Submitted| matches!(o, Submitted::Job(_));
    assert_eq!(
        outcomes.iter().filter(accepted).count(),
        3,
        "exactly the limit"
    );
    assert!(
        outcomes
            .iter()
            .all(|o| accepted(&o) || matches!(o, Submitted::TooFast { .. }))
    );
    assert_eq!(
        store.chat_queue_depth().await.expect("depth"),
        3,
        "the refused stored nothing"
    );
}
