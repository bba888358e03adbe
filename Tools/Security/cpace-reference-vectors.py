# Writes the field-arithmetic reference vectors of Tests/ShoalSecurityTests/ReferenceVectors.swift (Python big integers
# as the independent reference for Field25519): python3 Tools/Security/cpace-reference-vectors.py
import random
p = 2**255 - 19
A = 486662
random.seed(20250611)
def le(x, n=32): return x.to_bytes(n, 'little').hex()
def leg(x):
    x %= p
    if x == 0: return 0
    return 1 if pow(x, (p-1)//2, p) == 1 else -1
vals = [0, 1, 2, 19, p-1, p-2, 2**255-20, 2**254, 2**64-1, 2**128+5, 486662] + [random.randrange(0, 2**255) for _ in range(10)]
# inputs given as raw 32-byte LE encodings with bit255 clear (decode reduces mod p); include non-canonical p..2^255-1
vals += [p, p+1, 2**255-1]
print("// (a, b, a+b, a-b, a*b, inverse(a), legendre(a)) little-endian hex; a, b may be non-canonical (< 2^255)")
print("static let fieldVectors: [(String, String, String, String, String, String, Int)] = [")
for i, a in enumerate(vals):
    b = vals[(i*7+3) % len(vals)] if i % 2 else random.randrange(0, 2**255)
    am, bm = a % p, b % p
    inv = pow(am, p-2, p)
    print(f'    ("{le(a)}", "{le(b)}", "{le((am+bm)%p)}", "{le((am-bm)%p)}", "{le(am*bm%p)}", "{le(inv)}", {leg(am)}),')
print("]")
def ell2(r):
    r %= p
    tv1 = (1 + 2*r*r) % p
    x1 = (-A * pow(tv1, p-2, p)) % p
    if x1 == 0: x1 = (-A) % p
    gx1 = (x1**3 + A*x1*x1 + x1) % p
    x2 = (-x1 - A) % p
    return x1 if leg(gx1) != -1 else x2
rs = [0, 1, 2, p-1, 2**255-1] + [random.randrange(0, 2**255) for _ in range(8)]
print("// (r as 32 LE bytes, bit 255 may be set; u = elligator2(r))")
print("static let elligatorVectors: [(String, String)] = [")
for r in rs:
    print(f'    ("{le(r)}", "{le(ell2(r % 2**255))}"),')
print("]")
print("// sqrt(-1)", le(pow(2, (p-1)//4, p)), "legendre(-A)", leg(-A), "leg(A+2)", leg(A+2), "leg(A*A-4)", leg(A*A-4))
