"""A least-recently-used cache on a doubly linked list and a dict."""


class _Node:
    __slots__ = ("key", "value", "prev", "next")

    def __init__(self, key=None, value=None):
        self.key = key
        self.value = value
        self.prev = None
        self.next = None


class LRUCache:
    """At most `capacity` entries; putting one more evicts the least recently used (and calls
    `on_evict(key, value)` when given). `get` and `put` count as uses; `peek` does not."""

    def __init__(self, capacity, on_evict=None):
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.on_evict = on_evict
        self.hits = 0
        self.misses = 0
        self._map = {}
        # Sentinels: head.next is the most recently used entry, tail.prev the least.
        self._head = _Node()
        self._tail = _Node()
        self._head.next = self._tail
        self._tail.prev = self._head

    def __len__(self):
        return len(self._map)

    def __contains__(self, key):
        return key in self._map

    def _unlink(self, node):
        node.prev.next = node.next
        node.next.prev = node.prev

    def _push_front(self, node):
        node.prev = self._head
        node.next = self._head.next
        self._head.next.prev = node
        self._head.next = node

    def get(self, key, default=None):
        node = self._map.get(key)
        if node is None:
            self.misses += 1
            return default
        self.hits += 1
        self._unlink(node)
        self._push_front(node)
        return node.value

    def peek(self, key, default=None):
        node = self._map.get(key)
        return default if node is None else node.value

    def put(self, key, value):
        node = self._map.get(key)
        if node is not None:
            node.value = value
            self._unlink(node)
            self._push_front(node)
            return
        if len(self._map) >= self.capacity:
            oldest = self._tail.prev
            self._unlink(oldest)
            del self._map[oldest.key]
            if self.on_evict is not None:
                self.on_evict(oldest.key, oldest.value)
        node = _Node(key, value)
        self._map[key] = node
        self._push_front(node)

    def delete(self, key):
        """Remove `key`; True when it was there."""
        node = self._map.pop(key, None)
        if node is None:
            return False
        self._unlink(node)
        return True

    def keys(self):
        """Keys from the least to the most recently used."""
        node = self._tail.prev
        while node is not self._head:
            yield node.key
            node = node.prev

    def hit_rate(self):
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def resize(self, capacity):
        """Change the capacity, evicting the least recently used entries that no longer fit."""
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        while len(self._map) > capacity:
            oldest = self._tail.prev
            self._unlink(oldest)
            del self._map[oldest.key]
            if self.on_evict is not None:
                self.on_evict(oldest.key, oldest.value)
