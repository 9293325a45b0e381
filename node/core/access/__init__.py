"""Who may do what: roles and grants over queue names, and the limits on clients before and
while they log in. Pure: no I/O, no clock (`now_ms` comes in).
"""
