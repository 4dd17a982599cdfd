// Stub of MetalPerformanceShaders for the Objective-C++ syntax check (see Foundation/Foundation.h):
// the class torch's MPSStream.h names.
#pragma once

#import <Metal/Metal.h>

@interface MPSCommandBuffer : NSObject <MTLCommandBuffer>
@end
