"""ParentLink records the process and thread that start a child: the thread decides whether Linux may kill it."""
from __future__ import annotations

import os
import pickle
import threading

from tensorsmith.ir.orphans import ParentLink


def pickled_on_another_thread(link: ParentLink) -> ParentLink:
    """`link` pickled and unpickled as Process.start() would do it from a thread other than the main one."""
    copies: list[ParentLink] = []
    thread = threading.Thread(target=lambda: copies.append(pickle.loads(pickle.dumps(link))))
    thread.start()
    thread.join()
    return copies[0]


def test_a_link_pickled_on_the_main_thread_says_so() -> None:
    assert pickle.loads(pickle.dumps(ParentLink())) == ParentLink(os.getpid(), True)


def test_a_link_made_on_the_main_thread_but_pickled_on_another_says_another() -> None:
    """A pool's one link is pickled anew for each worker, in whichever thread starts that worker."""
    assert pickled_on_another_thread(ParentLink()) == ParentLink(os.getpid(), False)
