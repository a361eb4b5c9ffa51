//! Group commit: one writer thread, many waiting requests, one transaction.
//!
//! SQLite allows one writer at a time and a durable commit costs an fsync (~0.2 ms here). If
//! every request committed alone, throughput would stop at one fsync stream. Instead requests
//! queue their write as a job; the writer takes every job waiting, runs each inside its own
//! savepoint of one transaction, commits once (one fsync), and only then answers each job. A
//! job that fails rolls back its own savepoint and leaves the others alone; a failed commit
//! fails them all, so no caller is ever told "stored" for something that is not on disk.
//! Under load, jobs pile up while the previous fsync runs, so groups grow with concurrency.

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

/// The handle callers write through; the thread stops when the last handle is dropped.
pub(super) struct Writer {
    jobs: mpsc::Sender<Box<dyn Job>>,
}

impl Writer {
    pub(super) fn spawn(conn: Connection) -> std::io::Result<Writer> {
        let (jobs, queue) = mpsc::channel(QUEUE);
        thread::Builder::new()
            .name("sabi-sqlite-writer".into())
            .spawn(move || run(conn, queue))?;
        Ok(Writer { jobs })
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
        answer
            .await
            .map_err(|_| Error::Unavailable("the SQLite writer dropped a job".into()))?
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
    // IMMEDIATE takes the write lock now, so another process's writer makes us wait here
    // (busy_timeout) rather than fail at commit.
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
        let error = super::unavailable(e);
        for job in group {
            job.abandon(Error::Unavailable(error.to_string()));
        }
        return;
    }
    let finishes: Vec<Finish> = group.into_iter().map(|job| job.run(conn)).collect();
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

fn in_savepoint<T>(conn: &Connection, op: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
    exec_cached(conn, "SAVEPOINT job")?;
    match op(conn) {
        Ok(value) => {
            exec_cached(conn, "RELEASE job")?;
            Ok(value)
        }
        Err(e) => {
            exec_cached(conn, "ROLLBACK TO job")?;
            exec_cached(conn, "RELEASE job")?;
            Err(e)
        }
    }
}

/// Savepoint statements run for every job: prepared once, not parsed each time.
fn exec_cached(conn: &Connection, sql: &str) -> Result<()> {
    conn.prepare_cached(sql)
        .and_then(|mut statement| statement.execute([]))
        .map(drop)
        .map_err(super::unavailable)
}
