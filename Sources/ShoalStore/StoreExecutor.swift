#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A serial executor with a thread of its own, for the actor that owns a SQLite connection.
///
/// SQLite calls block: a long apply, a fold of a million rows, a wait on another process's lock (up to the busy
/// timeout). Run on the cooperative pool, each would hold one of its few threads (two on a two-core machine) and
/// stall every other task of the process, NIO's async channels included. The ``SerializedStore`` actor runs its jobs
/// here instead, as GRDB runs a database's accesses on a serial dispatch queue of its own.
///
/// The thread lives until ``shutdown()``; jobs still queued then are run first.
package final class StoreExecutor: SerialExecutor, @unchecked Sendable {
    // @unchecked: `jobs` and `stopping` are read and written only with `mutex` held; the thread is started once,
    // in init, and only the condition variable crosses threads.
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private let condition: UnsafeMutablePointer<pthread_cond_t>
    private var jobs: [UnownedJob] = []
    private var stopping = false

    /// Starts the executor's thread.
    package init() {
        mutex = .allocate(capacity: 1)
        condition = .allocate(capacity: 1)
        pthread_mutex_init(mutex, nil)
        pthread_cond_init(condition, nil)
        let context = Unmanaged.passRetained(Box(executor: self)).toOpaque()
        var thread = pthread_t()
        let created = pthread_create(&thread, nil, { raw in
            let box = Unmanaged<Box>.fromOpaque(raw!).takeRetainedValue()
            box.executor.runJobs()
            return nil
        }, context)
        precondition(created == 0, "could not start the store's thread (pthread_create: \(created))")
        pthread_detach(thread)
    }

    deinit {
        pthread_cond_destroy(condition)
        pthread_mutex_destroy(mutex)
        condition.deallocate()
        mutex.deallocate()
    }

    package func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        pthread_mutex_lock(mutex)
        jobs.append(job)
        pthread_cond_signal(condition)
        pthread_mutex_unlock(mutex)
    }

    package func asUnownedSerialExecutor() -> UnownedSerialExecutor {
        UnownedSerialExecutor(ordinary: self)
    }

    /// Lets the thread end once the jobs queued so far have run.
    package func shutdown() {
        pthread_mutex_lock(mutex)
        stopping = true
        pthread_cond_signal(condition)
        pthread_mutex_unlock(mutex)
    }

    /// The thread's loop: runs jobs in the order they came, until shut down and drained.
    private func runJobs() {
        var batch: [UnownedJob] = []
        while true {
            pthread_mutex_lock(mutex)
            while jobs.isEmpty && !stopping { pthread_cond_wait(condition, mutex) }
            if jobs.isEmpty {
                pthread_mutex_unlock(mutex)
                return
            }
            swap(&batch, &jobs)
            pthread_mutex_unlock(mutex)
            for job in batch { job.runSynchronously(on: asUnownedSerialExecutor()) }
            batch.removeAll(keepingCapacity: true)
        }
    }

    /// What the thread is started with: it keeps the executor alive until the thread ends.
    private final class Box {
        let executor: StoreExecutor
        init(executor: StoreExecutor) { self.executor = executor }
    }
}
