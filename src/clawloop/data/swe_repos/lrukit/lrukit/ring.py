"""A fixed-size ring buffer."""


class RingBuffer:
    """Keeps the last `capacity` items appended; appending to a full buffer drops the oldest."""

    def __init__(self, capacity):
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._items = [None] * capacity
        self._start = 0
        self._size = 0

    @property
    def capacity(self):
        return len(self._items)

    def __len__(self):
        return self._size

    def is_full(self):
        return self._size == self.capacity

    def append(self, item):
        end = (self._start + self._size) % self.capacity
        self._items[end] = item
        if self.is_full():
            self._start = (self._start + 1) % self.capacity
        else:
            self._size += 1

    def popleft(self):
        if self._size == 0:
            raise IndexError("pop from an empty ring buffer")
        item = self._items[self._start]
        self._items[self._start] = None
        self._start = (self._start + 1) % self.capacity
        self._size -= 1
        return item

    def __getitem__(self, index):
        """The index-th oldest item; negative indexes count from the newest."""
        if index < 0:
            index += self._size
        if not 0 <= index < self._size:
            raise IndexError("ring buffer index out of range")
        return self._items[(self._start + index) % self.capacity]

    def to_list(self):
        return [self[i] for i in range(self._size)]
