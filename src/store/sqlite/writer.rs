//! Group commit: one writer thread, many waiting requests, one transaction.
//!
//! SQLite allows one writer at a time and a durable commit costs an fsync (~0.2 ms here). If
//! every request committed alone, throughput would stop at one fsync stream. Instead requests
//! queue their write as a job; the writer takes every job waiting, runs each inside its own
//! savepoint of one transaction, commits once (one fsync), and only then answers each job. A
//! job that fails rolls back its own savepoint and leaves the others alone; a failed commit
//! fails them all, so no caller is ever told "stored" for something that is not on disk. When
//! SQLite aborts the whole transaction mid-group (disk full, I/O error), or a job panics, the
//! group stops there and every job in it is refused.
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

type Finish = Box<dyn FnOnce(Result<()>) + Send>;

trait Job: Send {
    /// Runs inside the open transaction; returns what to tell the caller once the commit is known.
    fn run(self: Box<Self>, conn: &Connection) -> Finish;
    /// The transaction could not begin: the job never ran.
    fn abandon(self: Box<Self>, error: Error);
}

struct Op<F, T> {
    op: F,
    reply: oneshot::Sender<Result<T>>,
}

impl<F, T> Job for Op<F, T>
where
    F: FnOnce(&Connection) -> Result<T> + Send,
    T: Send + 'static,
{
    fn run(self: Box<Self>, conn: &Connection) -> Finish {
        let Op { op, reply } = *self;
        let outcome = in_savepoint(conn, op);
        Box::new(move |commit| {
            // A caller that went away (request cancelled) needs no answer.
            let _ = reply.send(commit.and(outcome));
        })
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

    /// Runs `op` in the next group transaction and returns its result once committed.
    ///
    /// # Errors
    /// `op`'s own error (its writes rolled back), or [`Error::Unavailable`] when the group
    /// could not commit.
    pub(super) async fn write<T, F>(&self, op: F) -> Result<T>
    where
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job: Box<dyn Job> = Box::new(Op { op, reply });
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

fn commit_group(conn: &Connection, group: Vec<Box<dyn Job>>) {
    // A transaction left open by an earlier failure would make every BEGIN fail from now on.
    if !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    // IMMEDIATE takes the write lock now, so another process's writer makes us wait here
    // (busy_timeout) rather than fail at commit.
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
        abandon_all(group, &super::unavailable(e));
        return;
    }
    let mut finishes: Vec<Finish> = Vec::with_capacity(group.len());
    let mut jobs = group.into_iter();
    while let Some(job) = jobs.next() {
        // A panicking job must not take the writer thread, and every later write, with it.
        let ran = panic::catch_unwind(AssertUnwindSafe(|| job.run(conn)));
        let failure = match ran {
            Ok(finish) => {
                finishes.push(finish);
                // Some errors (disk full, I/O) make SQLite roll the whole transaction back:
                // what ran so far is gone, and later jobs must not commit on their own.
                (conn.is_autocommit()).then(|| "SQLite aborted the transaction".to_owned())
            }
            Err(_) => Some("a write panicked".to_owned()),
        };
        if let Some(reason) = failure {
            tracing::error!(
                reason,
                "a group commit failed; every write in it is refused"
            );
            let _ = conn.execute_batch("ROLLBACK");
            let error = Error::Unavailable(reason);
            for finish in finishes {
                finish(Err(Error::Unavailable(error.to_string())));
            }
            abandon_all(jobs.collect(), &error);
            return;
        }
    }
    let commit = conn.execute_batch("COMMIT").map_err(super::unavailable);
    if commit.is_err() {
        // Nothing of the group is kept; every caller hears so.
        let _ = conn.execute_batch("ROLLBACK");
    }
    for finish in finishes {
        finish(match &commit {
            Ok(()) => Ok(()),
            Err(e) => Err(Error::Unavailable(e.to_string())),
        });
    }
}

fn abandon_all(jobs: Vec<Box<dyn Job>>, error: &Error) {
    for job in jobs {
        job.abandon(Error::Unavailable(error.to_string()));
    }
}

/// Runs `op` in its own savepoint. If the savepoint cannot be released or rolled back, the
/// transaction is rolled back whole, so a half-done job is never committed with the group.
fn in_savepoint<T>(conn: &Connection, op: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
    exec_cached(conn, "SAVEPOINT job")?;
    let outcome = op(conn);
    let closed = match &outcome {
        Ok(_) => exec_cached(conn, "RELEASE job"),
        Err(_) => {
            exec_cached(conn, "ROLLBACK TO job").and_then(|()| exec_cached(conn, "RELEASE job"))
        }
    };
    if let Err(e) = closed {
        // The group sees the transaction gone (autocommit) and refuses every write in it.
        let _ = conn.execute_batch("ROLLBACK");
        return Err(e);
    }
    outcome
}

/// Savepoint statements run for every job: prepared once, not parsed each time.
fn exec_cached(conn: &Connection, sql: &str) -> Result<()> {
    conn.prepare_cached(sql)
        .and_then(|mut statement| statement.execute([]))
        .map(drop)
        .map_err(super::unavailable)
}
