// Stub of Apple's Foundation for the Objective-C++ syntax check of csrc/mps on Linux: only the
// declarations the host and torch's MPS headers use, with Apple's signatures. A method that is
// not declared here fails the check (-Werror=objc-method-access): add it as the SDK declares it.
#pragma once

#include <stddef.h>
#include <stdint.h>

typedef long NSInteger;
typedef unsigned long NSUInteger;
typedef signed char BOOL;
#define YES ((BOOL)1)
#define NO ((BOOL)0)
#define nil nullptr
#define NS_ENUM(type, name) \
  enum name : type name;    \
  enum name : type
#define NS_OPTIONS(type, name) \
  enum name : type name;       \
  enum name : type

@protocol NSObject
- (instancetype)retain;
- (oneway void)release;
@end

@interface NSObject <NSObject>
+ (instancetype)alloc;
+ (instancetype)new;
- (instancetype)init;
@end

@protocol NSCopying
@end

@interface NSString : NSObject <NSCopying>
+ (instancetype)stringWithUTF8String:(const char*)nullTerminatedCString;
@property(readonly) const char* UTF8String;
@property(readonly) NSUInteger length;
@end

@interface NSError : NSObject
@property(readonly, copy) NSString* localizedDescription;
@property(readonly) NSInteger code;
@end

@interface NSArray<ObjectType> : NSObject
@property(readonly) NSUInteger count;
@end

@interface NSDictionary<KeyType, ObjectType> : NSObject
@end

@interface NSMutableDictionary<KeyType, ObjectType> : NSDictionary <KeyType, ObjectType>
@end

// libdispatch, which Foundation brings in: queues are Objective-C objects under ARC.
@protocol OS_dispatch_queue <NSObject>
@end
typedef NSObject<OS_dispatch_queue>* dispatch_queue_t;
typedef void (^dispatch_block_t)(void);
void dispatch_sync(dispatch_queue_t queue, dispatch_block_t block);
void dispatch_async(dispatch_queue_t queue, dispatch_block_t block);
