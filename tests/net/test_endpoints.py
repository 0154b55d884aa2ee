"""asyncrl.net.endpoints.bind: port 0 picks a free port; the endpoint returned is the one bound."""

import zmq

from asyncrl.net import endpoints


def test_port_zero_picks_a_free_port_and_names_it():
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.ROUTER), ctx.socket(zmq.ROUTER)
    try:
        ea, eb = endpoints.bind(a, "tcp://127.0.0.1:0"), endpoints.bind(b, "tcp://127.0.0.1:0")
        assert ea.startswith("tcp://127.0.0.1:") and not ea.endswith(":0") and ea != eb
        c = ctx.socket(zmq.ROUTER)
        assert endpoints.bind(c, "inproc://x") == "inproc://x"
        c.close(0)
    finally:
        a.close(0)
        b.close(0)
        ctx.term()
