//! Group commit: one writer thread, many waiting requests, one transaction.
//!
//! SQLite allows one writer at a time and a durable commit costs an fsync (~0.2 ms here). If
//! every request committed alone, throughput would stop at one fsync stream. Instead requests
//! queue their write as a job; the writer takes every job waiting, runs them one after another
//! in one transaction, commits once (one fsync), and only then answers each job. A job that
//! fails must leave nothing behind, yet the others should commit. A job that fails before
//! changing a row (a lost lease) leaves nothing and the group goes on; one that changed rows
//! makes the writer roll the transaction back and run the group again without it, this time
//! each job in its own savepoint (jobs are `FnMut` for this, and their state is all in the
//! store), so a group runs at most twice however many of its jobs fail. The common group runs
//! once, with no savepoint per job: a savepoint copies every page a job first touches to
//! SQLite's statement journal, a tenth of the writer's work when each ran in its own. A
//! failed commit fails them all, so no caller is ever told "stored" for something that is not
//! on disk. When SQLite aborts the whole transaction mid-group (disk full, I/O error), or a
//! job panics, the group stops there and every job in it is refused.
//! Under load, jobs pile up while the previous fsync runs, so groups grow with concurrency.

use std::panic::{self, AssertUnwindSafe};
use std::thread;

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use crate::store::{Error, Result};

/// Jobs that may wait for the writer; further callers wait to enqueue (backpressure).
const QUEUE: usize = 4096;
/// Jobs in one transaction at most, so that one commit never holds the lock for long.
const GROUP: usize = 1024;

trait Job: Send {
    /// Runs inside the open transaction; false when the job's own write failed. May run again
    /// (after the group's transaction is rolled back) when another job of the group failed.
    fn run(&mut self, conn: &Connection) -> bool;
    /// Tells the caller the outcome of its last run, once the commit is known.
    fn finish(self: Box<Self>, commit: Result<()>);
    /// The job never ran, or its group was refused.
    fn abandon(self: Box<Self>, error: Error);
}

struct Op<F, T> {
    op: F,
    outcome: Option<Result<T>>,
    reply: oneshot::Sender<Result<T>>,
}

impl<F, T> Job for Op<F, T>
where
    F: FnMut(&Connection) -> Result<T> + Send,
    T: Send + 'static,
{
    fn run(&mut self, conn: &Connection) -> bool {
        let outcome = (self.op)(conn);
        let ok = outcome.is_ok();
        self.outcome = Some(outcome);
        ok
    }

    fn finish(self: Box<Self>, commit: Result<()>) {
        let outcome = self
            .outcome
            .unwrap_or_else(|| Err(Error::Unavailable("the write never ran".into())));
        // A caller that went away (request cancelled) needs no answer.
        let _ = self.reply.send(commit.and(outcome));
    }

    fn abandon(self: Box<Self>, error: Error) {
        let _ = self.reply.send(Err(error));
    }
}

/// The handle callers write through. Dropping it stops the thread and waits for it, so its
/// connection is closed when the store is: the last connection's close folds the WAL into
/// the database and removes it, leaving nothing of a deleted row behind.
pub(super) struct Writer {
    jobs: mpsc::Sender<Box<dyn Job>>,
    waits: Waits,
    thread: Option<thread::JoinHandle<()>>,
}

/// How callers wait for their commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Waits {
    /// On the async task: the usual way.
    Async,
    /// On a blocking thread, so that a runtime whose time is paused sees work under way and
    /// does not jump its clock while the commit is on disk (`sabi simulate`).
    Blocking,
}

impl Writer {
    pub(super) fn spawn(conn: Connection, waits: Waits) -> std::io::Result<Writer> {
        let (jobs, queue) = mpsc::channel(QUEUE);
        let thread = thread::Builder::new()
            .name("sabi-sqlite-writer".into())
            .spawn(move || run(conn, queue))?;
        Ok(Writer {
            jobs,
            waits,
            thread: Some(thread),
        })
    }

    /// False once the writer thread has stopped: every write would fail.
    pub(super) fn is_alive(&self) -> bool {
        !self.jobs.is_closed()
    }

    /// Runs `op` in the next group transaction and returns its result once committed. `op`
    /// may run twice (after its group's transaction is rolled back): everything it does must
    /// stay inside the connection.
    ///
    /// # Errors
    /// `op`'s own error (its writes rolled back), or [`Error::Unavailable`] when the group
    /// could not commit.
    pub(super) async fn write<T, F>(&self, op: F) -> Result<T>
    where
        F: FnMut(&Connection) -> Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job: Box<dyn Job> = Box::new(Op {
            op,
            outcome: None,
            reply,
        });
        self.jobs
            .send(job)
            .await
            .map_err(|_| Error::Unavailable("the SQLite writer has stopped".into()))?;
        let answer = match self.waits {
            Waits::Async => answer.await,
            Waits::Blocking => tokio::task::spawn_blocking(move || answer.blocking_recv())
                .await
                .map_err(|e| Error::Unavailable(e.to_string()))?,
        };
        answer.map_err(|_| Error::Unavailable("the SQLite writer dropped a job".into()))?
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // The queue closes with its last sender: the thread commits what it holds and ends.
        let (closed, _) = mpsc::channel(1);
        drop(std::mem::replace(&mut self.jobs, closed));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(conn: Connection, mut queue: mpsc::Receiver<Box<dyn Job>>) {
    while let Some(first) = queue.blocking_recv() {
        let mut group = vec![first];
        while group.len() < GROUP {
            match queue.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        commit_group(&conn, group);
    }
}

fn commit_group(conn: &Connection, mut group: Vec<Box<dyn Job>>) {
    let mut failed = vec![false; group.len()];
    // The first pass runs the jobs plainly. When one fails, the transaction is rolled back
    // and a second pass runs the others each in its own savepoint, so that further failures
    // cost only themselves: a group runs at most twice, however many of its jobs fail.
    for apart in [false, true] {
        if apart && failed.iter().all(|f| *f) {
            break;
        }
        if let Err(error) = begin(conn) {
            return refuse(group, &failed, &error);
        }
        match run_group(conn, &mut group, &mut failed, apart) {
            Ran::All => break,
            Ran::Failed => {
                if let Err(e) = conn.execute_batch("ROLLBACK") {
                    return refuse(group, &failed, &super::unavailable(e));
                }
            }
            Ran::Aborted(reason) => {
                tracing::error!(
                    reason,
                    "a group commit failed; every write in it is refused"
                );
                let _ = conn.execute_batch("ROLLBACK");
                return abandon_all(group, &Error::Unavailable(reason));
            }
        }
    }
    let commit = match conn.is_autocommit() {
        // Every job failed before a transaction held anything: nothing to commit.
        true => Ok(()),
        false => conn.execute_batch("COMMIT").map_err(super::unavailable),
    };
    if commit.is_err() {
        // Nothing of the group is kept; every caller hears so.
        let _ = conn.execute_batch("ROLLBACK");
    }
    for job in group {
        job.finish(match &commit {
            Ok(()) => Ok(()),
            Err(e) => Err(Error::Unavailable(e.to_string())),
        });
    }
}

/// How a pass over the group's jobs ended.
enum Ran {
    /// Every job not failed before ran; those that failed in this pass (in savepoints) left
    /// nothing.
    All,
    /// A job failed outside a savepoint (now marked): the transaction holds its partial
    /// writes and must be rolled back.
    Failed,
    /// The transaction is gone (SQLite aborted it) or a job panicked.
    Aborted(String),
}

fn begin(conn: &Connection) -> Result<()> {
    // A transaction left open by an earlier failure would make every BEGIN fail from now on.
    if !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    // IMMEDIATE takes the write lock now, so another process's writer makes us wait here
    // (busy_timeout) rather than fail at commit.
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(super::unavailable)
}

/// Runs every job not yet failed; `apart` puts each in its own savepoint.
fn run_group(
    conn: &Connection,
    group: &mut [Box<dyn Job>],
    failed: &mut [bool],
    apart: bool,
) -> Ran {
    for (job, failed) in group.iter_mut().zip(failed.iter_mut()) {
        if *failed {
            continue;
        }
        if apart && let Err(e) = exec_cached(conn, "SAVEPOINT job") {
            return Ran::Aborted(e.to_string());
        }
        // A panicking job must not take the writer thread, and every later write, with it.
        let changed_before = conn.total_changes();
        let Ok(wrote) = panic::catch_unwind(AssertUnwindSafe(|| job.run(conn))) else {
            return Ran::Aborted("a write panicked".to_owned());
        };
        // Some errors (disk full, I/O) make SQLite roll the whole transaction back: what ran
        // so far is gone, and later jobs must not commit on their own.
        if conn.is_autocommit() {
            return Ran::Aborted("SQLite aborted the transaction".to_owned());
        }
        *failed = !wrote;
        // A job that failed before changing a row (a lease check) left nothing to undo.
        if !apart && !wrote && conn.total_changes() != changed_before {
            return Ran::Failed;
        }
        if apart {
            let closed = match wrote {
                true => exec_cached(conn, "RELEASE job"),
                false => exec_cached(conn, "ROLLBACK TO job")
                    .and_then(|()| exec_cached(conn, "RELEASE job")),
            };
            if let Err(e) = closed {
                return Ran::Aborted(e.to_string());
            }
        }
    }
    Ran::All
}

/// Savepoint statements: prepared once, not parsed each time.
fn exec_cached(conn: &Connection, sql: &str) -> Result<()> {
    conn.prepare_cached(sql)
        .and_then(|mut statement| statement.execute([]))
        .map(drop)
        .map_err(super::unavailable)
}

/// The group cannot go on: jobs that failed on their own hear their own error, the rest
/// `error`.
fn refuse(group: Vec<Box<dyn Job>>, failed: &[bool], error: &Error) {
    for (job, failed) in group.into_iter().zip(failed) {
        match failed {
            true => job.finish(Ok(())),
            false => job.abandon(Error::Unavailable(error.to_string())),
        }
    }
}

fn abandon_all(jobs: Vec<Box<dyn Job>>, error: &Error) {
    for job in jobs {
        job.abandon(Error::Unavailable(error.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> Connection {
        let conn = Connection::open_in_memory().expect("opens");
        conn.execute_batch("CREATE TABLE t (v INTEGER UNIQUE)")
            .expect("creates");
        conn
    }

    fn job<T, F>(op: F) -> (Box<dyn Job>, oneshot::Receiver<Result<T>>)
    where
        F: FnMut(&Connection) -> Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let op = Op {
            op,
            outcome: None,
            reply,
        };
        (Box::new(op), answer)
    }

    fn insert(conn: &Connection, v: i64) -> Result<()> {
        conn.execute("INSERT INTO t (v) VALUES (?1)", [v])
            .map(drop)
            .map_err(super::super::unavailable)
    }

    fn rows(conn: &Connection) -> Vec<i64> {
        let mut statement = conn
            .prepare("SELECT v FROM t ORDER BY v")
            .expect("prepares");
        statement
            .query_map([], |row| row.get(0))
            .expect("reads")
            .collect::<Result<_, _>>()
            .expect("rows")
    }

    #[test]
    fn a_failed_job_leaves_nothing_and_the_rest_of_its_group_commits() {
        let conn = store();
        let (first, first_answer) = job(|c| insert(c, 1));
        // Writes, then fails: its row must not survive.
        let (half, half_answer) = job(|c| {
            insert(c, 2)?;
            Err::<(), _>(Error::NotFound)
        });
        // Counts what the jobs before it left: run again after the failure, it sees one row.
        let (count, count_answer) = job(|c| {
            insert(c, 3)?;
            c.query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0))
                .map_err(super::super::unavailable)
        });
        let (duplicate, duplicate_answer) = job(|c| insert(c, 1));
        let (last, last_answer) = job(|c| insert(c, 4));
        commit_group(&conn, vec![first, half, count, duplicate, last]);

        assert_eq!(rows(&conn), [1, 3, 4]);
        assert!(first_answer.blocking_recv().expect("answered").is_ok());
        assert!(matches!(
            half_answer.blocking_recv().expect("answered"),
            Err(Error::NotFound)
        ));
        assert_eq!(
            count_answer.blocking_recv().expect("answered").ok(),
            Some(2)
        );
        assert!(duplicate_answer.blocking_recv().expect("answered").is_err());
        assert!(last_answer.blocking_recv().expect("answered").is_ok());
        assert!(conn.is_autocommit(), "the transaction ended");
    }

    #[test]
    fn a_group_runs_at_most_twice_however_many_of_its_jobs_fail() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let conn = store();
        let runs = Arc::new(AtomicUsize::new(0));
        let mut answers = Vec::new();
        let mut group = Vec::new();
        for v in 0..20_i64 {
            let runs = Arc::clone(&runs);
            let (one, answer) = job(move |c| {
                runs.fetch_add(1, Ordering::Relaxed);
                insert(c, v)?;
                // Every other job fails after its write.
                match v % 2 {
                    0 => Ok(()),
                    _ => Err(Error::NotFound),
                }
            });
            group.push(one);
            answers.push(answer);
        }
        commit_group(&conn, group);

        assert_eq!(rows(&conn), (0..20).step_by(2).collect::<Vec<i64>>());
        for (v, answer) in answers.into_iter().enumerate() {
            let answer = answer.blocking_recv().expect("answered");
            assert_eq!(answer.is_ok(), v % 2 == 0, "job {v}: {answer:?}");
        }
        // The first pass stops at the first failure (2 runs), the second runs the other 19.
        assert_eq!(runs.load(Ordering::Relaxed), 2 + 19);
    }

    #[test]
    fn a_job_that_fails_before_changing_a_row_costs_the_others_nothing() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let conn = store();
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = |op: fn(&Connection) -> Result<()>| {
            let runs = Arc::clone(&runs);
            job(move |c| {
                runs.fetch_add(1, Ordering::Relaxed);
                op(c)
            })
        };
        let (first, first_answer) = counted(|c| insert(c, 1));
        // Refused on a check, as a lost lease is: nothing written.
        let (refused, refused_answer) = counted(|_| Err(Error::LeaseLost));
        let (last, last_answer) = counted(|c| insert(c, 2));
        commit_group(&conn, vec![first, refused, last]);

        assert_eq!(rows(&conn), [1, 2]);
        assert_eq!(runs.load(Ordering::Relaxed), 3, "each job ran once");
        assert!(first_answer.blocking_recv().expect("answered").is_ok());
        assert!(matches!(
            refused_answer.blocking_recv().expect("answered"),
            Err(Error::LeaseLost)
        ));
        assert!(last_answer.blocking_recv().expect("answered").is_ok());

        // A group of refusals alone commits nothing and answers each with its own error.
        let (alone, alone_answer) = counted(|_| Err(Error::LeaseLost));
        commit_group(&conn, vec![alone]);
        assert!(matches!(
            alone_answer.blocking_recv().expect("answered"),
            Err(Error::LeaseLost)
        ));
        assert!(conn.is_autocommit());
    }

    #[test]
    fn a_panicking_job_refuses_its_whole_group() {
        let conn = store();
        let (first, first_answer) = job(|c| insert(c, 1));
        let (panics, panics_answer) = job(|_| -> Result<()> { panic!("a bug in a write") });
        let (last, last_answer) = job(|c| insert(c, 2));
        commit_group(&conn, vec![first, panics, last]);

        assert!(rows(&conn).is_empty());
        for answer in [first_answer, panics_answer, last_answer] {
            assert!(matches!(
                answer.blocking_recv().expect("answered"),
                Err(Error::Unavailable(_))
            ));
        }
        // The writer goes on: the next group commits.
        let (next, next_answer) = job(|c| insert(c, 5));
        commit_group(&conn, vec![next]);
        assert!(next_answer.blocking_recv().expect("answered").is_ok());
        assert_eq!(rows(&conn), [5]);
    }
}
