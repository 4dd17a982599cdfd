// Planted host bug (test_planted.py): buffers bound at storage_offset() elements instead of
// bytes, so a tensor that starts inside its storage (a slice) is read from the wrong place.
// Valid Objective-C++: the syntax check passes it; the host lint catches it.
#import <Metal/Metal.h>

#include <ATen/core/Tensor.h>

#include <initializer_list>
#include <vector>

void bind_buffers(id<MTLComputeCommandEncoder> enc, std::initializer_list<at::Tensor> tensors) {
  std::vector<id<MTLBuffer>> bufs;
  std::vector<NSUInteger> offsets;
  for (const at::Tensor& t : tensors) {
    bufs.push_back((__bridge id<MTLBuffer>)const_cast<void*>(t.storage().data()));
    offsets.push_back(static_cast<NSUInteger>(t.storage_offset()));
  }
  for (NSUInteger i = 0; i < bufs.size(); ++i) {
    [enc setBuffer:bufs[i] offset:offsets[i] atIndex:i];
  }
}
