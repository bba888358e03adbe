import ShoalFuzzing

#if canImport(Glibc)
import Glibc
#endif

// libFuzzer's entry points. The target comes from SHOAL_FUZZ_TARGET (Tools/fuzz.sh sets it), so that one
// binary serves every target.

nonisolated(unsafe) private var target = ShoalFuzzing.Target.codec

@_cdecl("LLVMFuzzerInitialize")
public func fuzzerInitialize(
    _ argc: UnsafeMutablePointer<CInt>?,
    _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>?
) -> CInt {
    guard let name = getenv("SHOAL_FUZZ_TARGET").map({ String(cString: $0) }),
        let chosen = ShoalFuzzing.Target(rawValue: name)
    else {
        let names = ShoalFuzzing.Target.allCases.map(\.rawValue).joined(separator: ", ")
        print("set SHOAL_FUZZ_TARGET to one of: \(names)")
        exit(2)
    }
    target = chosen
    return 0
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzerTestOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    ShoalFuzzing.run(target, UnsafeRawBufferPointer(start: data, count: size))
    return 0
}
