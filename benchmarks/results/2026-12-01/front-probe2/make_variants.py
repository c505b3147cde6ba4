"""Variants of box_conv.py for front_probe2.py: written next to this file as bv_*.py."""
import os
src = open(os.path.join(os.path.dirname(__file__), "..", "src", "vaeshard", "box_conv.py")).read()
src = src.replace("from . import norm_math", "from vaeshard import norm_math").replace(
    "from .triton_support import", "from vaeshard.triton_support import")
here = os.path.dirname(__file__)
# branch: the causal code path, every load through xd at the plain kernel's frame (x = the whole
# 6-frame buffer): the same addresses and descriptors as the plain kernel, the causal branches
b = src.replace("_input_box(cd, cd2, a, f, h0 - PH, w0 + kw - PW, c0, bar, R, CW)",
                "_input_box(xd, xd2, a, (nt // Tout) * Tin + v, h0 - PH, w0 + kw - PW, c0, bar, R, CW)")
b = b.replace("_input_box(xd, xd2, a, (nt // Tout) * Tin + v - 2, h0 - PH, w0 + kw - PW, c0, bar, R, CW)",
              "_input_box(xd, xd2, a, (nt // Tout) * Tin + v, h0 - PH, w0 + kw - PW, c0, bar, R, CW)")
assert b != src
open(os.path.join(here, "bv_branch.py"), "w").write(b)
# order: the cache's descriptors first among the kernel's parameters
o = src.replace("""        xd, xd2, cd, cd2, wd, wd2, od, od2, y_ptr, b_ptr, g_ptr, nb_ptr, p_ptr, scale, eps, Tin, Tout, Tc, Ho, Wo, PH,""",
                """        cd, cd2, xd, xd2, wd, wd2, od, od2, y_ptr, b_ptr, g_ptr, nb_ptr, p_ptr, scale, eps, Tin, Tout, Tc, Ho, Wo, PH,""")
o = o.replace("""        xd, xd2, cd, cd2, wd, wd2, od, od2, out, unused if bias is None else bias, gamma,""",
              """        cd, cd2, xd, xd2, wd, wd2, od, od2, out, unused if bias is None else bias, gamma,""")
assert o.count("cd, cd2, xd, xd2, wd") == 2
open(os.path.join(here, "bv_order.py"), "w").write(o)
# weights last: the weight descriptors after the output's (another order)
w = src.replace("""        xd, xd2, cd, cd2, wd, wd2, od, od2, y_ptr, b_ptr, g_ptr, nb_ptr, p_ptr, scale, eps, Tin, Tout, Tc, Ho, Wo, PH,""",
                """        xd, cd, xd2, cd2, wd, wd2, od, od2, y_ptr, b_ptr, g_ptr, nb_ptr, p_ptr, scale, eps, Tin, Tout, Tc, Ho, Wo, PH,""")
w = w.replace("""        xd, xd2, cd, cd2, wd, wd2, od, od2, out, unused if bias is None else bias, gamma,""",
              """        xd, cd, xd2, cd2, wd, wd2, od, od2, out, unused if bias is None else bias, gamma,""")
open(os.path.join(here, "bv_interleaved.py"), "w").write(w)
print("variants written")
