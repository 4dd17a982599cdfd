// Stub of MetalPerformanceShadersGraph for the Objective-C++ syntax check (see
// Foundation/Foundation.h): the classes torch's MPSStream.h names.
#pragma once

#import <MetalPerformanceShaders/MetalPerformanceShaders.h>

@interface MPSGraph : NSObject
@end

@interface MPSGraphExecutionDescriptor : NSObject
@end

@interface MPSGraphCompilationDescriptor : NSObject
@end
