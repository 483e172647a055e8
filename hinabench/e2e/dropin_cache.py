"""The KV cache appended in place, for the engines with HiNa decode attention (`hina+a`, `hina+l+a`).

transformers' DynamicLayer grows its keys and values by `torch.cat` at every step: each decode step
copies the layer's whole cache (at 4096 tokens of Qwen3-30B-A3B, 8 MiB read and 8 MiB written per
layer and step, ~0.5 ms of a ~5 ms layer on 2 cores), work no engine with a paged or preallocated cache
does. AppendLayer keeps them in buffers with room to grow (the capacity doubled when full, so an append
is amortised O(1)) and hands attention views of the first L positions: the same [B, h_kv, L, d] tensors
as DynamicLayer's (head_dim contiguous; the sequence and head strides are the capacity's), which
HiNa's decode attention and sdpa both read in place. Everything else is DynamicLayer's.
"""
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def _viewed(name: str) -> property:
    """AppendLayer.keys / .values: the view of its buffers' first `length` positions, made when read (a native
    append, dropin_layer.py, then costs one integer add per layer and step, not two views with cold caches)."""
    def get(self):
        if self._stale:
            self._views()
        return self.__dict__.get(name)

    def put(self, t):
        self.__dict__[name] = t
    return property(get, put)


class AppendLayer(DynamicLayer):
    _stale = False   # positions committed whose views (keys, values) are not made yet
    keys = _viewed("_keys")
    values = _viewed("_values")

    def _views(self):
        self._stale = False
        self.keys, self.values = self.buffers[0][..., :self.length, :], self.buffers[1][..., :self.length, :]

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized and self.buffers is not None else super().get_seq_length()

    def lazy_initialization(self, key_states, value_states):
        super().lazy_initialization(key_states, value_states)
        self.length, self.buffers = 0, None

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        keys, values, start = self.reserve(n, like=(key_states, value_states))
        keys[..., start:start + n, :].copy_(key_states)
        values[..., start:start + n, :].copy_(value_states)
        return self.commit(n)

    def reserve(self, n, like=None):
        """Room for n more positions: (key buffer, value buffer, where they start); commit(n) once written
        (dropin_layer.py writes them in its native call)."""
        end = self.length + n
        if self.buffers is None or end > self.buffers[0].shape[-2]:
            cap = max(end, 2 * self.length, 256)
            old = (self.keys, self.values)   # (views of the old buffers: made before they are replaced)
            self.buffers = tuple(x.new_empty(x.shape[:-2] + (cap, x.shape[-1])) for x in like or old)
            if self.length:
                self.buffers[0][..., :self.length, :].copy_(old[0])
                self.buffers[1][..., :self.length, :].copy_(old[1])
        return self.buffers[0], self.buffers[1], self.length

    def commit(self, n, views: bool = True):
        """n more positions written; their views now (views=True: update's return) or when next read."""
        self.length += n
        self._stale = True
        if views:
            self._views()
            return self.keys, self.values

    def crop(self, tokens_to_remove):
        super().crop(tokens_to_remove)
        self.length = self.keys.shape[-2]        # still views of the buffers

    def batch_repeat_interleave(self, repeats):
        super().batch_repeat_interleave(repeats)
        self.buffers = None                      # new tensors: the next append copies them into new buffers

    def batch_select_indices(self, indices):
        super().batch_select_indices(indices)
        self.buffers = None


def append_cache(config) -> DynamicCache:
    """transformers' DynamicCache for `config`, its full-attention layers appended in place."""
    cache = DynamicCache(config=config)
    cache.layers = [AppendLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache
