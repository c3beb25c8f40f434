"""Named ASCII boards used across the tests (agent i: start letter A+i, goal letter a+i)."""

from envsim.instance import Instance

CROSSING = Instance.from_str("""
.A.
B.b
.a.
""")  # two agents cross the centre: one must wait

OPEN = Instance.from_str("""
A.b
...
B.a
""")  # room to pass: no wait needed

CORRIDOR_DEADLOCK = Instance.from_str("""
AHa
.Hb
B..
""")  # one corridor, the agents would have to swap: no plan exists

CUT_OFF = Instance.from_str("""
A.H
HHa
...
""")  # agent 0's goal is not reachable
