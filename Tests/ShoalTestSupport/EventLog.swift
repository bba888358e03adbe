/// Collects events (a node's) so tests can wait for one (with a deadline) instead of sleeping.
public actor EventLog<Event: Sendable> {
    /// Every event so far, in order.
    public private(set) var events: [Event] = []

    /// An empty log.
    public init() {}
    private var waiters:
        [(id: Int, matches: @Sendable (Event) -> Bool, continuation: CheckedContinuation<Bool, Never>)] = []
    private var nextWaiter = 0

    /// Records an event, waking the waiters it matches.
    public func append(_ event: Event) {
        events.append(event)
        for waiter in waiters where waiter.matches(event) { waiter.continuation.resume(returning: true) }
        waiters.removeAll { $0.matches(event) }
    }

    /// Whether an event matching `matches` happened already, or happens within `seconds`.
    public func seen(within seconds: Double, _ matches: @escaping @Sendable (Event) -> Bool) async -> Bool {
        if events.contains(where: matches) { return true }
        return await next(within: seconds, matches)
    }

    /// Waits for the next event matching `matches`; `false` if none came within `seconds`.
    public func next(within seconds: Double, _ matches: @escaping @Sendable (Event) -> Bool) async -> Bool {
        nextWaiter += 1
        let id = nextWaiter
        return await withCheckedContinuation { continuation in
            waiters.append((id, matches, continuation))
            Task {
                try? await Task.sleep(for: .milliseconds(Int(seconds * 1000)))
                self.expire(id)
            }
        }
    }

    private func expire(_ id: Int) {
        guard let index = waiters.firstIndex(where: { $0.id == id }) else { return }
        waiters.remove(at: index).continuation.resume(returning: false)
    }
}

