import NIOCore

/// Closes a connection whose peer takes none of what the relay writes for `timeout`.
///
/// An answer is written in slices, each once the connection has taken the ones before (its outbound buffer back under
/// the low watermark), so a peer that reads at all keeps the connection writable now and then. One that stops reading
/// would hold its answer's buffers as long as the connection lasts: Hummingbird's idle timeout does not run while an
/// answer is being written.
final class RelayWriteStallHandler: ChannelInboundHandler, RemovableChannelHandler {
    // Requests pass through untouched: only the channel's writability is watched.
    typealias InboundIn = NIOAny

    private let timeout: TimeAmount
    private var stall: Scheduled<Void>?

    init(timeout: TimeAmount) {
        self.timeout = timeout
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable {
            stall?.cancel()
            stall = nil
        } else if stall == nil {
            let loop = context.eventLoop.assumeIsolated()
            stall = loop.scheduleTask(in: timeout) { [weak self] in
                guard let self, self.stall != nil else { return }
                self.stall = nil
                context.close(promise: nil)
            }
        }
        context.fireChannelWritabilityChanged()
    }

    func channelInactive(context: ChannelHandlerContext) {
        stall?.cancel()
        stall = nil
        context.fireChannelInactive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        stall?.cancel()
        stall = nil
    }
}
